"""The one place services send a run's Celery tasks from (runs, scheduling and telemetry alike; by name: the
platform never imports the workers package, posttrain.core.task_queue). Call it after commit, the worker must see the rows. Tests
replace `run_task` to record what would be sent."""

from __future__ import annotations

import uuid

from posttrain.core.task_queue import task_send


def run_task(task_name: str, run_id: uuid.UUID | str) -> None:
    """Queue the task `workers.<task_name>` for one run."""
    task_send(task_name, str(run_id))
