"""Every kind of worker job (reward trials, reward probes, environment generation, environment trials, judge runs)
runs through the one runner and ends the same ways: a worker killed at Celery's hard time limit leaves its job
`running`, and the periodic expiry fails it saying it passed its time limit; the soft limit ends it with a
readable reason; a job no worker took is failed too. Each kind's Celery task is called as the worker calls it,
with the kind's own work replaced by what the test needs it to do."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from posttrain.core.job_runner import STALE_GRACE_S, worker_job_kinds, worker_jobs_expire
from posttrain.core.worker_jobs import WorkerJob
from posttrain.registry.models import Environment, EnvironmentTrial, RewardProbe, RewardTrial
from posttrain.review.models import JudgeRun
from tests.unit.platform.helpers import registry_rows

pytestmark = pytest.mark.django_db

reward_try = importlib.import_module("posttrain.registry.services.reward_try")
reward_probes = importlib.import_module("posttrain.registry.services.reward_probes")
environments = importlib.import_module("posttrain.registry.services.environments")
judging = importlib.import_module("posttrain.review.judging")


class WorkerKilled(BaseException):
    """Celery's hard limit kills the worker's child: nothing after it runs, not even an `except Exception`."""


def make_trial(rows: dict[str, Any]) -> WorkerJob:
    sample = {"prompt": "What is 2 + 2?", "response": "4", "label": "4", "metadata": {}}
    return RewardTrial.objects.create(kind="try", spec={"type": "exact_match", "name": "exact"}, samples=[sample])


def make_probe(rows: dict[str, Any]) -> WorkerJob:
    return RewardProbe.objects.create(reward=rows["exact"], dataset=rows["dataset"])


def make_environment(rows: dict[str, Any], **fields: Any) -> Environment:
    return Environment.objects.create(name="arith", package="openenv", env_id="app:app", size=2, **fields)


def make_environment_trial(rows: dict[str, Any]) -> WorkerJob:
    ready = make_environment(rows, state="ready", dataset=rows["dataset"])
    return EnvironmentTrial.objects.create(environment=ready, moves=["4"])


def make_judge(rows: dict[str, Any]) -> WorkerJob:
    return JudgeRun.objects.create(reward=rows["exact"], reward_name="exact answer", spec=rows["exact"].spec)


# kind: (a queued job, the kind's work that the test replaces: module and name, the Celery task)
KINDS: dict[str, tuple[Callable[[dict[str, Any]], WorkerJob], Any, str, str]] = {
    "reward trial": (make_trial, reward_try, "_run_trial", "reward_trial_run"),
    "reward probe": (make_probe, reward_probes, "_probe", "reward_probe_run"),
    "environment": (make_environment, environments, "_generate", "environment_generate"),
    "environment trial": (make_environment_trial, environments, "_play", "environment_trial_run"),
    "judge run": (make_judge, judging, "_score_all", "review_judge_run"),
}


@pytest.fixture
def rows(tmp_path):
    return registry_rows(tmp_path, [("What is 2 + 2?", "4")])


def run_task(kind: str, job: WorkerJob, monkeypatch, work: Callable[..., Any]) -> None:
    """The kind's Celery task as the worker runs it, on `job`, with the kind's work replaced by `work`."""
    _, module, name, task = KINDS[kind]
    from workers import tasks

    monkeypatch.setattr(module, name, work)
    getattr(tasks, task)(str(job.pk))


def killed(*args: Any) -> Any:
    raise WorkerKilled


def at_soft_limit(*args: Any) -> Any:
    raise SoftTimeLimitExceeded


@pytest.mark.parametrize("kind", KINDS)
def test_a_job_whose_worker_is_killed_at_the_hard_limit_ends_failed_saying_it_passed_its_time_limit(
    kind, rows, monkeypatch
):
    job = KINDS[kind][0](rows)
    with pytest.raises(WorkerKilled):
        run_task(kind, job, monkeypatch, killed)
    job.refresh_from_db()
    assert job.state == job.running_state and job.started_at and not job.finished_at  # what the kill left behind

    hard_s = type(job).hard_limit_s()
    assert worker_jobs_expire(now=job.started_at + timedelta(seconds=hard_s)) == 0  # it might still be running
    assert worker_jobs_expire(now=job.started_at + timedelta(seconds=hard_s + STALE_GRACE_S + 1)) == 1
    job.refresh_from_db()
    assert job.state == "failed" and job.finished_at is not None
    assert job.error.startswith("passed its time limit") and f"stops user code after {hard_s:g}s" in job.error


@pytest.mark.parametrize("kind", KINDS)
def test_a_job_stopped_at_the_soft_limit_ends_with_the_limit_as_its_reason(kind, rows, monkeypatch):
    job = KINDS[kind][0](rows)
    run_task(kind, job, monkeypatch, at_soft_limit)
    job.refresh_from_db()
    reason = f"stopped at the user-code time limit ({type(job).soft_limit_s():g}s)"
    if kind == "reward trial":  # a "Try it" answers with the stop as the code's result, sample by sample
        assert job.state == "done" and reason in job.result["errors"][0][0]
    else:
        assert job.state == "failed" and job.error == reason
    assert job.finished_at is not None


@pytest.mark.parametrize("kind", KINDS)
def test_a_job_no_worker_took_is_failed_once_its_wait_is_over(kind, rows):
    job = KINDS[kind][0](rows)
    model = type(job)
    wait_s = model.queue_wait_s()
    assert worker_jobs_expire(now=job.created_at + timedelta(seconds=wait_s - 1)) == 0
    assert worker_jobs_expire(now=job.created_at + timedelta(seconds=wait_s + 1)) == 1
    job.refresh_from_db()
    assert job.state == "failed" and job.error.startswith(f"no worker took it within {wait_s:g}s")


@pytest.mark.parametrize("kind", KINDS)
def test_a_second_delivery_of_a_finished_jobs_task_changes_nothing(kind, rows, monkeypatch):
    job = KINDS[kind][0](rows)
    run_task(kind, job, monkeypatch, lambda job: {})
    job.refresh_from_db()
    assert job.state == job.done_state and job.started_at <= job.finished_at
    run_task(kind, job, monkeypatch, killed)  # it would raise if it ran again
    assert type(job)._default_manager.get(pk=job.pk).finished_at == job.finished_at


def test_every_kind_is_expired_at_the_limits_its_celery_task_runs_under_on_the_user_code_queue():
    from workers.celery_app import app

    app.loader.import_default_modules()
    assert {model.__name__ for model in worker_job_kinds()} == {
        "RewardTrial",
        "RewardProbe",
        "Environment",
        "EnvironmentTrial",
        "JudgeRun",
    }
    for model in worker_job_kinds():
        task = app.tasks[f"workers.{model.task_name}"]
        assert (task.soft_time_limit, task.time_limit) == (model.soft_limit_s(), model.hard_limit_s()), model
        assert settings.CELERY_TASK_ROUTES[task.name] == {"queue": settings.USER_CODE_QUEUE}


def test_a_running_job_from_before_start_times_were_kept_is_failed_once_it_cannot_be_alive(rows):
    job = make_judge(rows)
    JudgeRun.objects.filter(pk=job.pk).update(state="running")  # no started_at: recorded before it was kept
    bound = JudgeRun.queue_wait_s() + JudgeRun.hard_limit_s() + STALE_GRACE_S
    assert worker_jobs_expire(now=job.created_at + timedelta(seconds=bound - 1)) == 0
    assert worker_jobs_expire(now=job.created_at + timedelta(seconds=bound + 1)) == 1
    assert JudgeRun.objects.get(pk=job.pk).error.startswith("passed its time limit")
