"""The Celery worker's side: submit (the one path, for both schedulers), stop and reconcile each run's Ray job.

These functions take the Ray Jobs client as `jobs` (default: the module settings.RUNS_JOBS_CLIENT names,
workers/ray_jobs.py, imported on first use, so the web process never imports ray). A run whose job ended
is settled from Ray's answer and any events left in its run folder; a running run whose engine went silent
is failed as lost."""

from __future__ import annotations

import logging
import re
import signal
import time
import uuid
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from posttrain.core.errors import JobsUnavailable
from posttrain.core.run_tokens import token_files_remove
from posttrain.runs.models import Run
from posttrain.runs.services.state_machine import ACTIVE_STATES, S, run_transition
from posttrain.scheduling.services.jobs_api import JobsClient
from posttrain.scheduling.services.jobs_api import default_jobs as _default_jobs
from posttrain.scheduling.services.preemption import preemption_forced, run_preemption_deadline, run_preemption_settle
from posttrain.telemetry import ingestion
from rl_engine.spec.jobs import EXIT_PREEMPTED, EXIT_TIME_LIMIT, is_user_output

logger = logging.getLogger(__name__)


JOB_TERMINAL = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})
# The last line of a Python traceback for ENOSPC (`OSError: [Errno 28] No space left on device: '...'`), as the
# engine itself prints it; user code's lines are marked (rl_engine.user_output) and never count.
_NO_SPACE = re.compile(r"^(?:[\w.]+\.)?\w*Error: \[Errno 28\] No space left on device")


def run_submit(run_id: uuid.UUID | str, *, jobs: JobsClient | None = None, admitted: bool = False) -> None:
    """Submit the run's Ray job (submission id = run id, so a retried task cannot start the run twice).

    Under `POSTTRAIN_SCHEDULER=all-at-once` the run is queued and moves queued → starting once Ray took the job;
    under admission the pass already moved it to starting (`admitted`). Ray not taking the job yet: an admitted run
    goes back to the queue, a queued one's task is retried until RUN_SUBMIT_TIMEOUT_S and then fails. Any other
    error fails the run with the reason."""
    expected = S.STARTING if admitted else S.QUEUED
    run = Run.objects.filter(pk=run_id).first()
    if run is None or run.state != expected:
        return  # gone, cancelled before it started, or already submitted by an earlier delivery
    jobs = jobs or _default_jobs()
    try:
        jobs.submit(run)
    except JobsUnavailable as exc:
        _not_taken_yet(run, exc)
        return
    except Exception as exc:
        logger.warning("submitting run %s failed", run.pk, exc_info=True)
        run_transition(run.pk, [expected], S.FAILED, f"submitting the Ray job failed: {type(exc).__name__}: {exc}")
        return
    if not admitted and not run_transition(run.pk, [S.QUEUED], S.STARTING, "Ray job submitted"):
        _stop_if_cancelled(run, jobs)


def _not_taken_yet(run: Run, exc: JobsUnavailable) -> None:
    """Ray cannot take the job now (busy, restarting): an admitted run waits for the next admission; a queued run's
    task raises to be retried with backoff (the reconcile resubmits runs left queued) until the run waited
    RUN_SUBMIT_TIMEOUT_S, then fails."""
    if run.state == S.STARTING:
        logger.info("Ray cannot take admitted run %s yet (%s); it goes back to the queue", run.pk, exc)
        run_transition(run.pk, [S.STARTING], S.QUEUED, f"Ray could not take the job yet: {exc}")
        return
    waited = (timezone.now() - run.state_changed_at).total_seconds()
    if waited < settings.RUN_SUBMIT_TIMEOUT_S:
        logger.info("Ray cannot take run %s yet (%s); the submit will be retried", run.pk, exc)
        raise exc
    run_transition(run.pk, [S.QUEUED], S.FAILED, f"Ray did not accept the job within {int(waited)} s: {exc}")


def _stop_if_cancelled(run: Run, jobs: JobsClient) -> None:
    """The job was submitted but the run left the queue meanwhile: cancelled while we were submitting, its job is
    stopped and the run settled."""
    run.refresh_from_db()
    if run.state in (S.CANCELLING, S.CANCELLED):
        jobs.stop(run)
        run_reconcile(run, jobs=jobs)


def run_stop(run_id: uuid.UUID | str, *, jobs: JobsClient | None = None, wait_s: float = 20.0) -> None:
    """The worker side of a cancel: stop the Ray job, wait (bounded) until Ray says it ended, then
    settle the run. If Ray is slow, the periodic reconcile finishes the job later."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None or run.state != S.CANCELLING:
        return
    jobs = jobs or _default_jobs()
    jobs.stop(run)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        status = jobs.status(run)
        if status is None or status in JOB_TERMINAL:
            break
        time.sleep(0.5)
    run_reconcile(run, jobs=jobs)


def _log_tail(text: str, max_lines: int = 30, max_chars: int = 3000) -> str:
    tail = "\n".join(text.strip().splitlines()[-max_lines:])
    return tail[-max_chars:]


def run_reconcile(run: Run, *, jobs: JobsClient | None = None, now=None) -> None:
    """Bring one active run (starting, running, cancelling, preempting) in line with its Ray job."""
    jobs = jobs or _default_jobs()
    run.refresh_from_db()
    if run.state not in ACTIVE_STATES:
        return
    status = jobs.status(run)
    if status is None and _admitted_moments_ago(run):
        run_submit(run.pk, jobs=jobs, admitted=True)  # the pass that admitted it has not submitted it (yet, or it died)
        return
    if status is None or status in JOB_TERMINAL:
        # An engine that died before reading its token left the file: no job will read it now.
        token_files_remove((run.resolved_config or {}).get("logging", {}).get("run_dir"))
        ingestion.events_recover_from_run_folder(run)
        run.refresh_from_db()
        if run.state not in ACTIVE_STATES:
            return  # the engine's own final status was among the recovered events
        _settle_ended_job(run, status, jobs)
    elif run.state == S.CANCELLING:
        jobs.stop(run)  # the cancel task may have died before Ray stopped it; ask again
    elif status == "RUNNING":
        now = now or timezone.now()
        if run.state == S.PREEMPTING and not run_preemption_deadline(run, jobs, now):
            jobs.preempt(run, run.state_reason)  # idempotent: a request lost with a worker is made again
        _fail_if_lost(run, jobs, now)


def _settle_ended_job(run: Run, status: str | None, jobs: JobsClient) -> None:
    """An active run whose Ray job is gone (None) or ended, and whose engine reported no final status."""
    active = [S.STARTING, S.RUNNING, S.CANCELLING, S.PREEMPTING]
    if status is None:
        if run.state == S.CANCELLING:
            run_transition(run.pk, [S.CANCELLING], S.CANCELLED, "cancelled")
        else:
            run_transition(
                run.pk,
                [S.STARTING, S.RUNNING, S.PREEMPTING],
                S.FAILED,
                f"the Ray job {run.ray_job_id} does not exist (was the Ray cluster restarted?)",
            )
    elif status == "SUCCEEDED":
        run_transition(run.pk, active, S.SUCCEEDED, "the Ray job succeeded (the engine's final status never arrived)")
    elif status in ("STOPPED", "FAILED") and run.state == S.PREEMPTING and preemption_forced(run):
        run_preemption_settle(run.pk, forced=True)  # stopped at the deadline (STOPPED, or killed: FAILED)
    elif status == "STOPPED":
        reason = "cancelled" if run.state == S.CANCELLING else "the Ray job was stopped outside Posttrain"
        run_transition(run.pk, active, S.CANCELLED, reason)
    elif status == "FAILED":
        code = None if run.state == S.CANCELLING else jobs.exit_code(run)
        if run.state == S.CANCELLING:
            run_transition(run.pk, [S.CANCELLING], S.CANCELLED, "cancelled")
        elif run.state == S.PREEMPTING and code == EXIT_PREEMPTED:
            run_preemption_settle(
                run.pk, forced=False, note="preempted: the engine checkpointed and exited for the scheduler"
            )
        else:
            tail = _log_tail(jobs.logs(run))
            headline = _job_failure_headline(code, tail)
            run_transition(
                run.pk,
                [S.STARTING, S.RUNNING, S.PREEMPTING],
                S.FAILED,
                f"{headline}; its last log lines:\n{tail}" if tail else f"{headline} (no logs)",
            )


def _job_failure_headline(exit_code: int | None, log_tail: str) -> str:
    """A failed job whose engine reported no final status: its driver (the engine process) died, and how.
    A full disk is named first: the engine cannot report it (its event log is on that disk). Only the engine's
    own lines count: what user code printed is marked in the log and cannot set the headline."""
    engine_lines = [line for line in log_tail.splitlines() if not is_user_output(line)]
    if any(_NO_SPACE.match(line.strip()) for line in engine_lines):
        return f"no space left on device: the run folder's disk ({settings.STORAGE_ROOT}) is full"
    if exit_code is None:
        return "the Ray job failed"
    if exit_code == EXIT_TIME_LIMIT:
        return "stopped at its time limit (train.max_wall_s) with a checkpoint"
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return f"driver died: the engine process was killed by {name}"
    return f"driver died: the engine process exited with code {exit_code} without reporting why"


def _admitted_moments_ago(run: Run) -> bool:
    waited = (timezone.now() - run.state_changed_at).total_seconds()
    return settings.SCHEDULER == "admission" and run.state == S.STARTING and waited < settings.RUN_SUBMIT_TIMEOUT_S


def _fail_if_lost(run: Run, jobs: JobsClient, now) -> None:
    """A job Ray calls running whose engine sent nothing for RUN_HEARTBEAT_TIMEOUT_S is lost: the
    platform can no longer tell what it does, so the run fails and the job is stopped. A starting run's
    silence counts from its admission when that is later: a preempted run admitted again has events from
    before it waited in the queue, and its new job has not spoken yet."""
    timeout = float(settings.RUN_HEARTBEAT_TIMEOUT_S)
    last = run.last_event_at or run.state_changed_at
    if run.state == S.STARTING and last is not None and run.state_changed_at is not None:
        last = max(last, run.state_changed_at)
    if last is None or now - last < timedelta(seconds=timeout):
        return
    hint = "" if run.last_event_at else f" (no event ever arrived: can the engine reach {settings.PUBLIC_URL}?)"
    if run_transition(
        run.pk, [S.STARTING, S.RUNNING, S.PREEMPTING], S.FAILED, f"lost: no event for {timeout:g}s{hint}"
    ):
        jobs.stop(run)
