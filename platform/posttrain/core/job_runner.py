"""The one way a worker job (posttrain.core.worker_jobs) is sent, run and ended, for every kind.

`job_dispatch` sends the kind's task after commit (the worker must see the row). `job_run`, the worker's
side, claims the job by compare-and-set (of two deliveries of one task, one runs it), requires the engine's
sandbox where the kind's code runs in it, runs the kind's body and records the outcome: done with the
body's fields, or failed with a readable reason. Celery's soft time limit is such a reason ("stopped at the
time limit"); its hard limit kills the worker's child before anything is recorded, so `worker_jobs_expire`
(beat) fails every kind's job whose worker cannot be alive any more, and every job no worker took."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from celery.exceptions import SoftTimeLimitExceeded
from django.apps import apps
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from posttrain.core.task_queue import task_send
from posttrain.core.worker_jobs import WorkerJob
from rl_engine.spec.user_code import sandbox

J = TypeVar("J", bound=WorkerJob)
# A job still running this long after its hard limit has no worker: the limit killed it (or the worker was lost).
STALE_GRACE_S = 30.0
MAX_ERROR_CHARS = 4000
POLL_INTERVAL_S = 0.1


def job_dispatch(job: WorkerJob, *, expires: float | None = None) -> None:
    """Send the job's task after commit (the worker must see the row); `expires`: when nobody waits any more."""
    transaction.on_commit(lambda: task_send(job.task_name, str(job.pk), expires=expires))


def job_wait(job: J, timeout_s: float) -> J:
    """The web's side of a job a request waits for ("Try it", an import check): `job` refreshed until it is
    finished or `timeout_s` passed; the client polls one still queued or running."""
    deadline = time.monotonic() + timeout_s
    while True:
        job.refresh_from_db(fields=["state", "error", "started_at", "finished_at", *job.result_fields])
        if job.state in (job.done_state, job.failed_state) or time.monotonic() >= deadline:
            return job
        time.sleep(POLL_INTERVAL_S)


def job_run(
    model: type[J],
    job_id: Any,
    body: Callable[[J], dict[str, Any]],
    *,
    needs_sandbox: Callable[[J], bool] = lambda job: True,
    expected: tuple[type[Exception], ...] = (),
    at_soft_limit: Callable[[J], dict[str, Any]] | None = None,
    related: tuple[str, ...] = (),
) -> J | None:
    """The worker's side of every kind: claim the queued job, run `body` (its fields are stored with `done`),
    end it. An `expected` exception, a missing sandbox or the soft time limit fail it with the reason (unless
    `at_soft_limit` makes a result of the stop); any other exception fails it too and is raised again for the
    worker's log. Returns the claimed job, or None when another delivery had it."""
    job = job_claim(model, job_id, related)
    if job is None:
        return None
    readable: tuple[type[Exception], ...] = (sandbox.SandboxUnavailable, *expected)
    try:
        if needs_sandbox(job):
            sandbox.require()  # refused before any user code runs: the reason says what to install
        fields = body(job)
    except SoftTimeLimitExceeded:
        if at_soft_limit is None:
            job_finish(job, job.failed_state, error=stopped_at_time_limit(model))
        else:
            job_finish(job, job.done_state, **at_soft_limit(job))
        return job
    except readable as exc:
        job_finish(job, job.failed_state, error=str(exc))
        return job
    except Exception as exc:
        job_finish(job, job.failed_state, error=f"{type(exc).__name__}: {exc}")
        raise
    job_finish(job, job.done_state, **fields)
    return job


def job_claim(model: type[J], job_id: Any, related: tuple[str, ...] = ()) -> J | None:
    """queued -> running, by compare-and-set: None when the job was taken, finished or expired already."""
    manager = model._default_manager
    claimed = manager.filter(pk=job_id, state=model.queued_state, started_at__isnull=True).update(
        state=model.running_state, started_at=timezone.now()
    )
    if not claimed:
        return None
    return manager.select_related(*related).get(pk=job_id)


def job_finish(job: WorkerJob, state: str, *, error: str = "", **fields: Any) -> None:
    """Record the outcome, only over a running job: one the expiry failed meanwhile keeps its reason."""
    type(job)._default_manager.filter(pk=job.pk, state=job.running_state).update(
        state=state, error=error[:MAX_ERROR_CHARS], finished_at=timezone.now(), **fields
    )


def stopped_at_time_limit(model: type[WorkerJob]) -> str:
    return f"stopped at the user-code time limit ({model.soft_limit_s():g}s)"


def worker_jobs_expire(now: datetime | None = None) -> int:
    """Fail every kind's jobs no worker will finish: running past the hard time limit (the worker's child
    was killed at it, or the worker lost), or queued past the longest wait (nobody took it). Periodic (beat);
    returns how many."""
    now = now or timezone.now()
    return sum(_expire_kind(model, now) for model in worker_job_kinds())


def worker_job_kinds() -> list[type[WorkerJob]]:
    """Every concrete worker job table, found in the app registry: core names none of the apps above it."""
    return [model for model in apps.get_models() if issubclass(model, WorkerJob)]


def _expire_kind(model: type[WorkerJob], now: datetime) -> int:
    hard_s, wait_s = model.hard_limit_s(), model.queue_wait_s()
    stale = now - timedelta(seconds=hard_s + STALE_GRACE_S)
    never_taken = now - timedelta(seconds=wait_s)
    manager = model._default_manager
    running = Q(started_at__lt=stale)
    if model.running_state != model.queued_state:
        # A running row from before `started_at` was kept has none: started at the latest when its wait ended.
        running |= Q(started_at__isnull=True, created_at__lt=stale - timedelta(seconds=wait_s))
    killed = manager.filter(running, state=model.running_state)
    expired = killed.update(
        state=model.failed_state,
        error=f"passed its time limit: the user-code worker stops user code after {hard_s:g}s and none "
        "finished it (killed at the limit, or lost); try again",
        finished_at=now,
    )
    return expired + manager.filter(
        state=model.queued_state, started_at__isnull=True, created_at__lt=never_taken
    ).update(
        state=model.failed_state,
        error=f"no worker took it within {wait_s:g}s: is the user-code worker running (`celery -A "
        f"workers.celery_app worker -Q {settings.USER_CODE_QUEUE}`)? Try again",
        finished_at=now,
    )
