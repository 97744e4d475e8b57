"""What the worker needs of Ray's Jobs API, and where it comes from: the module settings.RUNS_JOBS_CLIENT names
(workers/ray_jobs.py), imported on first use, so the web process never imports ray."""

from __future__ import annotations

from importlib import import_module
from typing import Protocol

from django.conf import settings

from posttrain.runs.models import Run


class JobsClient(Protocol):
    """What the worker needs of Ray's Jobs API (workers/ray_jobs.py; tests pass a fake)."""

    def submit(self, run: Run) -> str: ...
    def stop(self, run: Run) -> bool: ...
    def status(self, run: Run) -> str | None: ...  # PENDING RUNNING STOPPED SUCCEEDED FAILED, None = no job
    def logs(self, run: Run) -> str: ...
    def exit_code(self, run: Run) -> int | None: ...  # the driver's, once the job ended; negative: a signal
    def preempt(self, run: Run, reason: str) -> None: ...  # checkpoint at the next step boundary and exit 75


def default_jobs() -> JobsClient:
    # A module whose functions are the Protocol's methods.
    return import_module(settings.RUNS_JOBS_CLIENT)
