"""Celery tasks. Each one loads what it needs by id and calls a single service.

Services are imported inside the tasks: this module is imported while the Celery app starts, before
Django's app registry is ready. The Ray client (workers/ray_jobs.py) is imported by the services
that need it, in the worker only.
"""

import platform

from django.conf import settings

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
    from posttrain.scheduling import services

    services.run_submit(run_id)


@app.task(name="workers.admit_runs")
def admit_runs(trigger_run_id: str | None = None) -> int:
    """An admission pass (a run was launched or stopped holding resources: `trigger_run_id`); serialized
    across workers by a row lock, so any number may run at once."""
    from posttrain.scheduling.services import runs_admit

    try:
        return len(runs_admit())
    except JobsUnavailable:
        return 0  # Ray unreachable: the periodic reconcile tries again


@app.task(name="workers.rollout_index_update", expires=3600)
def rollout_index_update(run_id: str) -> int:
    """The search index of the run's rollout files that have none yet (after a samples event)."""
    from posttrain.telemetry.rollouts import rollout_index_update

    return rollout_index_update(run_id)


@app.task(name="workers.run_cancel")
def run_cancel(run_id: str) -> None:
    """Stop a cancelling run's Ray job and settle the run."""
    from posttrain.scheduling import services

    services.run_stop(run_id)


@app.task(name="workers.runs_reconcile", expires=60)
def runs_reconcile() -> int:
    """Periodic (CELERY_BEAT_SCHEDULE): run states against Ray job states; lost heartbeats fail runs."""
    from posttrain.scheduling import services

    return services.runs_reconcile()


@app.task(
    name="workers.reward_trial_run",
    # On the user_code queue (settings.CELERY_TASK_ROUTES), under Celery's time limits: the soft one ends the
    # trial as a result, the hard one kills the worker's child (the prefork pool replaces it).
    soft_time_limit=settings.USER_CODE_SOFT_TIME_LIMIT_S,
    time_limit=settings.USER_CODE_TIME_LIMIT_S,
)
def reward_trial_run(trial_id: str) -> None:
    """A reward's "Try it" or a new python reward's import check, in the engine's sandbox, on this worker."""
    from posttrain.registry import services

    services.reward_trial_run(trial_id)


@app.task(
    name="workers.reward_probe_run",
    # On the user_code queue (settings.CELERY_TASK_ROUTES), under the same time limits as a "Try it".
    soft_time_limit=settings.USER_CODE_SOFT_TIME_LIMIT_S,
    time_limit=settings.USER_CODE_TIME_LIMIT_S,
)
def reward_probe_run(probe_id: str) -> None:
    """A reward probed on a dataset's adversarial answers, in the engine's sandbox, on this worker."""
    from posttrain.registry import services

    services.reward_probe_run(probe_id)


@app.task(
    name="workers.review_judge_run",
    soft_time_limit=settings.USER_CODE_LONG_SOFT_TIME_LIMIT_S,
    time_limit=settings.USER_CODE_LONG_TIME_LIMIT_S,
)
def review_judge_run(judge_id: str) -> None:
    """A judge (a registered reward) scoring a review campaign's rollouts or a pool of runs' rollouts; user
    code, so routed to the user_code queue (settings.CELERY_TASK_ROUTES)."""
    from posttrain.review.judging import judge_run_execute

    judge_run_execute(judge_id)


@app.task(name="workers.review_campaign_build")
def review_campaign_build(campaign_id: str) -> None:
    """Draw the items of a campaign too large to build in its request (building → draft, or failed)."""
    from posttrain.review.services import campaign_build

    campaign_build(campaign_id)


@app.task(name="workers.run_alerts_notify")
def run_alerts_notify(run_id: str) -> int:
    """New critical alerts of a run, each recorded once and sent to its experiment's webhook."""
    from posttrain.telemetry import alerts

    return alerts.alerts_notify(run_id)


@app.task(name="workers.alert_deliver", bind=True, max_retries=None)
def alert_deliver(self, delivery_id: str) -> str:
    """POST one alert to its webhook; retried with backoff until sent or failed (the service counts attempts
    and decides when to give up, so Celery's own retry limit stays out of it)."""
    from posttrain.telemetry import alerts

    outcome, wait_s = alerts.alert_deliver(delivery_id)
    if outcome == "retry":
        raise self.retry(countdown=wait_s)
    return outcome


@app.task(name="workers.worker_jobs_expire", expires=60)
def worker_jobs_expire() -> int:
    """Periodic: fail the worker jobs of every kind (trials, probes, environments, judges) and the model imports
    that a killed or absent user-code worker left unfinished."""
    from posttrain.core.job_runner import worker_jobs_expire
    from posttrain.registry import services

    return worker_jobs_expire() + services.model_imports_expire()


@app.task(
    name="workers.model_import_run",
    # On the user_code queue (settings.CELERY_TASK_ROUTES): the conversion's own deadline, plus the time to copy a
    # server file in and move the result into place; the soft limit fails the import, the hard one kills the child.
    soft_time_limit=settings.GGUF_IMPORT_TIMEOUT_S + settings.GGUF_IMPORT_COPY_S,
    time_limit=settings.GGUF_IMPORT_TIMEOUT_S + settings.GGUF_IMPORT_COPY_S + 30,
)
def model_import_run(import_id: str) -> None:
    """A GGUF converted into a registry model, in the engine's sandbox on this worker."""
    from posttrain.registry import services

    services.model_import_run(import_id)


@app.task(
    name="workers.environment_generate",
    soft_time_limit=settings.USER_CODE_LONG_SOFT_TIME_LIMIT_S,
    time_limit=settings.USER_CODE_LONG_TIME_LIMIT_S,
)
def environment_generate(environment_id: str) -> None:
    """An installed environment's rows, generated in the engine's sandbox on this worker, stored as a dataset."""
    from posttrain.registry import services

    services.environment_generate(environment_id)


@app.task(
    name="workers.environment_trial_run",
    soft_time_limit=settings.USER_CODE_SOFT_TIME_LIMIT_S,
    time_limit=settings.USER_CODE_TIME_LIMIT_S,
)
def environment_trial_run(trial_id: str) -> None:
    """An environment's "Try it": one episode with typed moves, in the engine's sandbox on this worker."""
    from posttrain.registry import services

    services.environment_trial_run(trial_id)
