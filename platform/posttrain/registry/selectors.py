"""Reads of the registry."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from posttrain.registry.models import Dataset, ModelAsset, RewardFunction, RewardTrial


def model_list() -> QuerySet[ModelAsset]:
    return ModelAsset.objects.select_related("created_by")


def dataset_list() -> QuerySet[Dataset]:
    # The preview is up to 20 rows of text: only the preview endpoint reads it.
    return Dataset.objects.select_related("created_by").defer("preview")


def reward_list() -> QuerySet[RewardFunction]:
    return RewardFunction.objects.select_related("created_by")


def reward_trials(reward: RewardFunction) -> QuerySet[RewardTrial]:
    return RewardTrial.objects.filter(reward=reward, kind=RewardTrial.Kind.TRY)


def dataset_preview(dataset: Dataset) -> dict[str, Any]:
    """The first rows as stored at upload, with the columns and the field mapping."""
    return {
        "columns": dataset.columns,
        "rows": dataset.preview,
        "row_count": dataset.row_count,
        "prompt_field": dataset.prompt_field,
        "label_field": dataset.label_field,
    }
