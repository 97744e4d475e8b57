"""A worker job: user code a web request or a person asks for, run on the `user_code` Celery worker in the
engine's sandbox, never in the web process. Reward trials, environment trials, reward probes, environment
generation and judge runs are each a table of their own (their inputs and results differ) over these common
columns, which the one runner (posttrain.core.job_runner) and the one expiry read and write:

    queued --claim (compare-and-set)--> running --> done | failed (`error` says why)

A kind names its Celery task and the settings that hold its time limits and its longest wait in the queue, so
the expiry knows when a job's worker can no longer be alive (Celery's hard limit kills the worker's child
without a word) and fails the job with the reason, as the soft limit would have."""

from __future__ import annotations

from typing import ClassVar

from django.conf import settings
from django.db import models


class WorkerJobState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class WorkerJob(models.Model):
    """The columns every worker job has. A kind whose states are named otherwise (an environment is
    `generating` while queued and running, `ready` when done) overrides `state` and the state names below;
    `started_at` tells its queued job from its running one."""

    State = WorkerJobState

    # The expiry finds unfinished jobs by state, in every kind's table.
    state = models.CharField(
        max_length=10, choices=WorkerJobState.choices, default=WorkerJobState.QUEUED, db_index=True
    )
    error = models.TextField(blank=True, help_text="Why the worker could not run it (not the code's own errors).")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # The kind, for the runner and the expiry (class attributes, not columns).
    task_name: ClassVar[str]  # workers.<task_name>, on the user_code queue (settings.CELERY_TASK_ROUTES)
    queued_state: ClassVar[str] = WorkerJobState.QUEUED
    running_state: ClassVar[str] = WorkerJobState.RUNNING
    done_state: ClassVar[str] = WorkerJobState.DONE
    failed_state: ClassVar[str] = WorkerJobState.FAILED
    # The settings that hold the Celery task's soft and hard time limits (workers/tasks.py reads the same ones).
    soft_limit_setting: ClassVar[str] = "USER_CODE_SOFT_TIME_LIMIT_S"
    hard_limit_setting: ClassVar[str] = "USER_CODE_TIME_LIMIT_S"
    queue_wait_setting: ClassVar[str] = "USER_CODE_LONG_QUEUE_S"
    result_fields: ClassVar[tuple[str, ...]] = ()  # the kind's own columns the worker writes when it ends the job

    class Meta:
        abstract = True

    @classmethod
    def soft_limit_s(cls) -> float:
        return float(getattr(settings, cls.soft_limit_setting))

    @classmethod
    def hard_limit_s(cls) -> float:
        return float(getattr(settings, cls.hard_limit_setting))

    @classmethod
    def queue_wait_s(cls) -> float:
        """The longest a job waits for a worker before none will take it (its task expires, or nobody waits)."""
        return float(getattr(settings, cls.queue_wait_setting))
