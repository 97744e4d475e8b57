"""Where a run's files are: its run folder on the shared storage, and its rollout folder in the rollout store (a
local folder or an fsspec URL). Here, in runs, because launching a run writes both into its engine config; telemetry
reads and writes the rollout folder's files (posttrain.telemetry.rollouts)."""

from __future__ import annotations

import uuid
from pathlib import Path

from django.conf import settings

from posttrain_sdk import rollout_files


def run_dir_for(run_id: uuid.UUID | str) -> Path:
    return Path(settings.STORAGE_ROOT) / "runs" / str(run_id)


def rollout_folder(run_id: uuid.UUID | str) -> str:
    """The run's rollout folder in the store: a local path or an fsspec URL."""
    root = str(settings.ROLLOUT_STORE).rstrip("/")
    return f"{root}/runs/{run_id}/{rollout_files.FOLDER}"
