"""Celery tasks. Each one loads what it needs by id and calls a single service.

Services are imported inside the tasks: this module is imported while the Celery app starts, before
Django's app registry is ready. The Ray client (workers/ray_jobs.py) is imported by the services
that need it, in the worker only.
"""

import platform

from posttrain.core.errors import JobsUnavailable
from workers.celery_app import app


@app.task(name="workers.ping", ignore_result=False)
def ping() -> dict:
    """Round trip through the broker; also proves the stdlib `platform` module is intact in a worker."""
    return {"pong": True, "python": platform.python_version()}


@app.task(
    name="workers.run_submit",
    autoretry_for=(JobsUnavailable,),
    retry_backoff=2,
    retry_backoff_max=30,
    retry_jitter=False,
    max_retries=12,
)
def run_submit(run_id: str) -> None:
    """Submit a queued run's Ray job (idempotent: submission id = run id); retried while Ray cannot take it."""
    from posttrain.runs import services

    services.run_submit(run_id)


@app.task(name="workers.admit_runs")
def admit_runs(trigger_run_id: str | None = None) -> int:
    """An admission pass (a run was launched or stopped holding resources: `trigger_run_id`); serialized
    across workers by a row lock, so any number may run at once."""
    from posttrain.runs.services.scheduler import runs_admit

    try:
        return len(runs_admit())
    except JobsUnavailable:
        return 0  # Ray unreachable: the periodic reconcile tries again


@app.task(name="workers.run_cancel")
def run_cancel(run_id: str) -> None:
    """Stop a cancelling run's Ray job and settle the run."""
    from posttrain.runs import services

    services.run_stop(run_id)


@app.task(name="workers.runs_reconcile", expires=60)
def runs_reconcile() -> int:
    """Periodic (CELERY_BEAT_SCHEDULE): run states against Ray job states; lost heartbeats fail runs."""
    from posttrain.runs import services

    return services.runs_reconcile()


@app.task(name="workers.reward_trial_run")
def reward_trial_run(trial_id: str) -> None:
    """A reward's "Try it" or a new python reward's import check, in the engine's sandbox, on this worker."""
    from posttrain.registry import services

    services.reward_trial_run(trial_id)
