"""Migration projects 0001-0002 and the project fields of registry 0007, runs 0018 and review 0004: every row made
before projects lands in the default project, and every user in it with a role from their site role, so nothing is
lost or hidden when reads become scoped to projects."""

from __future__ import annotations

import pytest

from tests.support.migrations import a_run, latest_schema_after, migrate_to

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["latest_schema_after"]  # the fixture, used by name

BEFORE = [
    ("projects", None),
    ("registry", "0006_reward_probe"),
    ("runs", "0017_telemetry_models_to_telemetry"),
    ("review", "0003_rollout_turns"),
]


def _user(apps, username: str, group: str | None = None, superuser: bool = False):
    user = apps.get_model("auth", "User").objects.create(username=username, is_superuser=superuser)
    if group is not None:
        user.groups.add(apps.get_model("auth", "Group").objects.get_or_create(name=group)[0])
    return user


def test_rows_and_users_made_before_projects_are_all_in_the_default_project(latest_schema_after):
    old = migrate_to(BEFORE)
    try:
        _user(old, "root", superuser=True)
        ada = _user(old, "ada", "researcher")
        _user(old, "ann", "annotator")
        run = a_run(old)
        reward = old.get_model("registry", "RewardFunction").objects.create(
            name="exact", kind="builtin", spec={"type": "exact_match"}, created_by=ada
        )
        environment = old.get_model("registry", "Environment").objects.create(
            name="arith", package="reasoning_gym", env_id="basic_arithmetic", size=4
        )
        campaign = old.get_model("review", "Campaign").objects.create(
            name="c", questions=[], source={"runs": [str(run.pk)]}, created_by=ada
        )
        judge = old.get_model("review", "JudgeRun").objects.create(
            campaign=campaign, reward=reward, reward_name="exact", spec={}
        )
    finally:
        migrate_to([])

    from django.contrib.auth import get_user_model

    from posttrain.projects.access import readable
    from posttrain.projects.models import Membership, Project
    from posttrain.registry.models import Dataset, Environment, ModelAsset, RewardFunction
    from posttrain.review.models import Campaign, JudgeRun
    from posttrain.runs.models import Experiment, Run

    default = Project.objects.get(name="default")
    for model, pk in [
        (Run, run.pk),
        (Experiment, run.experiment_id),
        (ModelAsset, run.experiment.model_id),
        (Dataset, run.experiment.dataset_id),
        (RewardFunction, reward.pk),
        (Environment, environment.pk),
        (Campaign, campaign.pk),
        (JudgeRun, judge.pk),
    ]:
        assert model.objects.get(pk=pk).project_id == default.pk, model.__name__
    roles = dict(Membership.objects.filter(project=default).values_list("user__username", "role"))
    assert roles == {"root": "owner", "ada": "member", "ann": "viewer"}
    ada_now = get_user_model().objects.get(pk=ada.pk)
    assert list(readable(Run.objects.all(), ada_now).values_list("pk", flat=True)) == [run.pk]
    assert RewardFunction.objects.get(pk=reward.pk).created_by_id == ada.pk  # her own, she still writes it
