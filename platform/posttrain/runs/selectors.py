"""Reads of the runs app: experiments, runs, their checkpoints and state transitions."""

from __future__ import annotations

import json
import string
import uuid
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Count, QuerySet, TextField
from django.db.models.functions import Cast

from posttrain.registry.selectors import latest_probes
from posttrain.runs.models import Checkpoint, Experiment, Run, RunTransition


def experiment_list() -> QuerySet[Experiment]:
    return (
        Experiment.objects.select_related("project", "model", "dataset", "created_by")
        .prefetch_related("experimentreward_set__reward")
        .annotate(run_count=Count("runs"))
    )


def experiment_probe_summaries(experiment: Experiment) -> list[dict[str, Any]]:
    """Per reward of the experiment, its newest probe on the experiment's dataset (registry.RewardProbe), as
    the experiment and its runs' pages show it: {reward, reward_name, probe (id or None), state, hackable,
    worst, fraction, url}. A reward never probed there has probe None; an external run's project has none."""
    if experiment.dataset_id is None:
        return []
    rewards = [(link.reward_id, link.reward.name) for link in experiment.experimentreward_set.select_related("reward")]
    latest = latest_probes([reward_id for reward_id, _ in rewards], experiment.dataset_id)
    summaries = []
    for reward_id, name in rewards:
        probe = latest.get(reward_id)
        report = (probe.result or {}) if probe is not None else {}
        worst = report.get("worst")
        fraction = next((p["fraction"] for p in report.get("probes", []) if p["probe"] == worst), None)
        summaries.append(
            {
                "reward": reward_id,
                "reward_name": name,
                "probe": str(probe.pk) if probe is not None else None,
                "state": probe.state if probe is not None else None,
                "hackable": bool(report.get("hackable")),
                "worst": worst,
                "fraction": fraction,
                "url": f"/api/rewards/{reward_id}/probes/{probe.pk}/" if probe is not None else None,
            }
        )
    return summaries


def run_list() -> QuerySet[Run]:
    # The list serializer names each run's model and dataset: joined here, so a page is one query.
    return Run.objects.select_related("project", "experiment__model", "experiment__dataset", "created_by")


def validate_run_id_prefix(prefix: str) -> None:
    digits = prefix.replace("-", "")
    if not digits or len(digits) > 32 or any(c not in string.hexdigits for c in digits):
        raise ValidationError("must be the start of a run id: 1 to 32 hex digits (dashes optional)")


def runs_with_id_prefix(queryset: QuerySet[Run], prefix: str) -> QuerySet[Run]:
    """The runs whose id starts with `prefix` (validate_run_id_prefix's form), as a range of ids: both databases
    order UUIDs as their hex digits (Postgres by their bytes, SQLite by its 32-character text), and the
    primary key's index serves the range."""
    digits = prefix.replace("-", "").lower()
    return queryset.filter(id__gte=uuid.UUID(digits.ljust(32, "0")), id__lte=uuid.UUID(digits.ljust(32, "f")))


def runs_with_tag(queryset: QuerySet[Run], tag: str) -> QuerySet[Run]:
    if connection.vendor == "postgresql":
        return queryset.filter(tags__contains=[tag])
    # SQLite has no JSON containment: match the JSON-quoted tag in the stored text (json.dumps escapes
    # the same way Django stored it, so the quotes delimit a whole tag).
    return queryset.annotate(_tags_text=Cast("tags", TextField())).filter(_tags_text__contains=json.dumps(tag))


def run_checkpoints(run: Run) -> QuerySet[Checkpoint]:
    return Checkpoint.objects.filter(run=run).order_by("step")


def run_transitions(run: Run) -> QuerySet[RunTransition]:
    return RunTransition.objects.filter(run=run).order_by("at", "id")
