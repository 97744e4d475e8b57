"""Reads of the registry."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet

from posttrain.registry.models import (
    Dataset,
    Environment,
    EnvironmentTrial,
    ModelAsset,
    ModelImport,
    RewardFunction,
    RewardProbe,
    RewardTrial,
)


def model_list() -> QuerySet[ModelAsset]:
    return ModelAsset.objects.select_related("created_by", "project")


def model_imports() -> QuerySet[ModelImport]:
    return ModelImport.objects.select_related("created_by", "project", "model__created_by", "model__project")


def dataset_list() -> QuerySet[Dataset]:
    # The preview is up to 20 rows of text: only the preview endpoint reads it.
    return Dataset.objects.select_related("created_by", "project").defer("preview")


def reward_list() -> QuerySet[RewardFunction]:
    return RewardFunction.objects.select_related("created_by", "project")


def reward_trials(reward: RewardFunction) -> QuerySet[RewardTrial]:
    return RewardTrial.objects.filter(reward=reward, kind=RewardTrial.Kind.TRY)


def environment_list() -> QuerySet[Environment]:
    return Environment.objects.select_related("created_by", "project", "dataset", "reward")


def environment_trials(environment: Environment) -> QuerySet[EnvironmentTrial]:
    return EnvironmentTrial.objects.filter(environment=environment)


def reward_probes(reward: RewardFunction, dataset: Dataset | None = None) -> QuerySet[RewardProbe]:
    """The reward's probes, the newest first; on one dataset when given."""
    probes = RewardProbe.objects.filter(reward=reward).select_related("dataset")
    return probes.filter(dataset=dataset) if dataset is not None else probes


def latest_probes(reward_ids: Iterable[int], dataset_id: int) -> dict[int, RewardProbe]:
    """Each reward's newest probe on the dataset (any state: one still running shows as such)."""
    latest: dict[int, RewardProbe] = {}
    for probe in RewardProbe.objects.filter(reward_id__in=list(reward_ids), dataset_id=dataset_id).order_by(
        "-created_at"
    ):
        latest.setdefault(probe.reward_id, probe)
    return latest


def dataset_preview(dataset: Dataset) -> dict[str, Any]:
    """The first rows as stored at upload, with the columns and the field mapping."""
    return {
        "columns": dataset.columns,
        "rows": dataset.preview,
        "row_count": dataset.row_count,
        "prompt_field": dataset.prompt_field,
        "label_field": dataset.label_field,
    }
