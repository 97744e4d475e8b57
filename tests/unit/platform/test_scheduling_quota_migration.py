"""Migration scheduling 0003: a quota may belong to a project. Every quota made before keeps its user or group and its
limits, and the new constraint still refuses a quota with two owners (or none)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from tests.support.migrations import latest_schema_after, migrate_to

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["latest_schema_after"]  # the fixture, used by name

BEFORE = [("scheduling", "0002_tables_renamed")]


def test_quotas_made_before_keep_their_owner_and_a_quota_has_exactly_one(latest_schema_after):
    old = migrate_to(BEFORE)
    try:
        ann = old.get_model("auth", "User").objects.create(username="ann")
        lab = old.get_model("auth", "Group").objects.create(name="vision")
        old.get_model("scheduling", "Quota").objects.create(user=ann, max_runs=2, weight=3.0)
        old.get_model("scheduling", "Quota").objects.create(group=lab, max_gpus=8.0, borrowing=True)
    finally:
        migrate_to([])

    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from posttrain.projects.models import Project
    from posttrain.scheduling.models import Quota, QuotaKind

    quotas = Quota.objects.order_by("pk")
    assert [(q.kind, q.user_id, q.group_id, q.project_id, q.max_runs, q.weight) for q in quotas] == [
        (QuotaKind.USER, ann.pk, None, None, 2, 3.0),
        (QuotaKind.GROUP, None, lab.pk, None, None, 1.0),
    ]
    alpha = Project.objects.create(name="alpha")
    assert Quota.objects.create(project=alpha, max_runs=4).kind == QuotaKind.PROJECT
    # Fresh owners: the refusal must come from the constraint, not from one quota per owner.
    beta = Project.objects.create(name="beta")
    bob = get_user_model().objects.create(username="bob")
    team = Group.objects.create(name="nlp")
    for owners in ({"user": bob, "project": beta}, {"group": team, "project": beta}, {"user": bob, "group": team}, {}):
        with pytest.raises(IntegrityError), transaction.atomic():
            Quota.objects.create(max_runs=1, **owners)
    with pytest.raises(ValidationError, match="A quota belongs to exactly one user, group or project"):
        Quota(user=bob, project=beta).full_clean()
