"""The periodic reconcile: run states against Ray job states (a fake Jobs API here)."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from posttrain.runs.models import Run, RunState
from posttrain.scheduling import services
from posttrain.telemetry.models import MetricRow
from tests.unit.platform.helpers import FakeJobs, make_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]
S = RunState


@pytest.fixture
def jobs() -> FakeJobs:
    return FakeJobs()


def reconciled(run: Run, jobs: FakeJobs, status: str | None) -> Run:
    if status is not None:
        jobs.statuses[str(run.id)] = status
    services.runs_reconcile(jobs=jobs)
    run.refresh_from_db()
    return run


def test_a_failed_job_fails_the_run_with_the_tail_of_its_logs(experiment, jobs):
    run = make_run(experiment, S.RUNNING, last_event_at=timezone.now())
    jobs.job_logs[str(run.id)] = "\n".join(f"line {i}" for i in range(100)) + "\nerror: model.path: /m does not exist\n"
    run = reconciled(run, jobs, "FAILED")
    assert run.state == S.FAILED
    assert run.state_reason.startswith("the Ray job failed; its last log lines:\n")
    assert run.state_reason.endswith("error: model.path: /m does not exist")
    assert "line 10\n" not in run.state_reason  # only the tail


def test_a_driver_killed_by_a_signal_fails_the_run_as_driver_died_naming_the_signal(experiment, jobs):
    run = make_run(experiment, S.RUNNING, last_event_at=timezone.now())
    jobs.job_logs[str(run.id)] = "step 3/10\n"
    jobs.exit_codes[str(run.id)] = -9
    run = reconciled(run, jobs, "FAILED")
    assert run.state_reason == "driver died: the engine process was killed by SIGKILL; its last log lines:\nstep 3/10"


def test_a_driver_that_exited_without_a_final_status_fails_the_run_with_its_exit_code(experiment, jobs):
    run = make_run(experiment, S.RUNNING, last_event_at=timezone.now())
    jobs.exit_codes[str(run.id)] = 3
    run = reconciled(run, jobs, "FAILED")
    assert run.state_reason == "driver died: the engine process exited with code 3 without reporting why (no logs)"


def test_a_driver_that_died_of_a_full_disk_fails_the_run_saying_no_space_left(experiment, jobs, settings):
    settings.STORAGE_ROOT = "/srv/posttrain"
    run = make_run(experiment, S.RUNNING, last_event_at=timezone.now())
    jobs.job_logs[str(run.id)] = "step 3/10\nOSError: [Errno 28] No space left on device: 'events.jsonl'\n"
    jobs.exit_codes[str(run.id)] = 1
    run = reconciled(run, jobs, "FAILED")
    assert run.state_reason.startswith(
        "no space left on device: the run folder's disk (/srv/posttrain) is full; its last log lines:\n"
    )
    assert run.state_reason.endswith("No space left on device: 'events.jsonl'")


def test_what_user_code_printed_cannot_set_the_headline(experiment, jobs):
    # A reward printed a full disk (marked as user code in the log, rl_engine/user_output.py); the engine's own
    # last line is a reward failure quoting the same words: neither is the engine running out of disk.
    run = make_run(experiment, S.RUNNING, last_event_at=timezone.now())
    jobs.job_logs[str(run.id)] = (
        "[user code: reward.py] OSError: [Errno 28] No space left on device: 'x'\n"
        "rl_engine.rewards.loud.RewardsFailed: reward 'r' failed on 8 of 8 samples of the step (100%, over its "
        "max_error_rate of 0.5); the first error: r: OSError: [Errno 28] No space left on device\n"
    )
    jobs.exit_codes[str(run.id)] = 1
    run = reconciled(run, jobs, "FAILED")
    assert run.state_reason.startswith("driver died: the engine process exited with code 1 without reporting why;")
    assert "[user code: reward.py]" in run.state_reason  # the tail shows it, marked


def test_a_job_that_ended_leaves_no_token_file_in_the_run_folder(experiment, jobs, storage):
    run = make_run(experiment, S.RUNNING, last_event_at=timezone.now())
    folder = Path(run.resolved_config["logging"]["run_dir"])
    folder.mkdir(parents=True)
    (folder / "ingest_token.0f0f0f0f").write_text("an engine that died before reading it")
    (folder / "events.jsonl").write_text("")
    reconciled(run, jobs, "FAILED")
    assert sorted(p.name for p in folder.iterdir()) == ["events.jsonl"]


def test_a_stopped_job_ends_a_cancelling_run_cancelled(experiment, jobs):
    run = reconciled(make_run(experiment, S.CANCELLING), jobs, "STOPPED")
    assert (run.state, run.state_reason) == (S.CANCELLED, "cancelled")


def test_a_job_stopped_outside_the_platform_cancels_the_run_and_says_so(experiment, jobs):
    run = reconciled(make_run(experiment, S.RUNNING), jobs, "STOPPED")
    assert run.state == S.CANCELLED and "outside Posttrain" in run.state_reason


def test_a_succeeded_job_whose_final_status_never_arrived_ends_the_run_succeeded(experiment, jobs):
    run = reconciled(make_run(experiment, S.RUNNING), jobs, "SUCCEEDED")
    assert run.state == S.SUCCEEDED and "final status never arrived" in run.state_reason


def test_events_the_engine_could_not_deliver_are_recovered_from_the_run_folder(experiment, jobs):
    run = make_run(experiment, S.RUNNING)
    folder = Path(run.resolved_config["logging"]["run_dir"])
    folder.mkdir(parents=True)
    lines = [
        {
            "run": str(run.id),
            "seq": 1,
            "type": "status",
            "step": None,
            "time": time.time(),
            "data": {"state": "running"},
        },
        {"run": str(run.id), "seq": 2, "type": "metrics", "step": 1, "time": time.time(), "data": {"reward/mean": 0.5}},
        {
            "run": str(run.id),
            "seq": 3,
            "type": "status",
            "step": 1,
            "time": time.time(),
            "data": {"state": "failed", "reason": "ValueError: path: reward.py line 3: invalid syntax"},
        },
    ]
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines) + '{"torn')
    run = reconciled(run, jobs, "FAILED")
    assert run.state == S.FAILED and run.state_reason == "ValueError: path: reward.py line 3: invalid syntax"
    assert run.last_seq == 3 and MetricRow.objects.filter(run=run).count() == 1


def test_a_running_run_without_events_for_the_heartbeat_timeout_is_lost(experiment, jobs, settings):
    settings.RUN_HEARTBEAT_TIMEOUT_S = 60
    quiet = make_run(experiment, S.RUNNING, last_event_at=timezone.now() - timedelta(seconds=61))
    alive = make_run(experiment, S.RUNNING, last_event_at=timezone.now() - timedelta(seconds=5))
    jobs.statuses[str(alive.id)] = "RUNNING"
    quiet = reconciled(quiet, jobs, "RUNNING")
    alive.refresh_from_db()
    assert quiet.state == S.FAILED and quiet.state_reason.startswith("lost: no event for 60s")
    assert jobs.stopped == [str(quiet.id)]  # the platform gave up on it: the job must not run on
    assert alive.state == S.RUNNING


def test_a_run_that_never_sent_an_event_is_lost_with_a_hint_about_the_url(experiment, jobs, settings):
    settings.RUN_HEARTBEAT_TIMEOUT_S = 60
    run = make_run(experiment, S.STARTING, state_changed_at=timezone.now() - timedelta(seconds=120))
    run = reconciled(run, jobs, "RUNNING")
    assert run.state == S.FAILED and django_settings.PUBLIC_URL in run.state_reason


def test_a_pending_job_is_left_alone_however_long_it_waits(experiment, jobs, settings):
    settings.RUN_HEARTBEAT_TIMEOUT_S = 1
    run = make_run(experiment, S.STARTING, state_changed_at=timezone.now() - timedelta(hours=1))
    assert reconciled(run, jobs, "PENDING").state == S.STARTING


def test_a_run_whose_job_vanished_fails(experiment, jobs):
    run = reconciled(make_run(experiment, S.RUNNING), jobs, None)
    assert run.state == S.FAILED and "does not exist" in run.state_reason


def test_a_cancelling_run_whose_job_still_runs_gets_another_stop(experiment, jobs):
    jobs.stop_sets = None
    run = reconciled(make_run(experiment, S.CANCELLING), jobs, "RUNNING")
    assert run.state == S.CANCELLING and jobs.stopped == [str(run.id)]


def test_under_all_at_once_a_run_queued_longer_than_the_grace_period_is_submitted_again(experiment, jobs, settings):
    settings.SCHEDULER = "all-at-once"
    stale = make_run(experiment, S.QUEUED, state_changed_at=timezone.now() - timedelta(minutes=5))
    fresh = make_run(experiment, S.QUEUED)
    services.runs_reconcile(jobs=jobs)
    stale.refresh_from_db()
    fresh.refresh_from_db()
    assert jobs.submitted == [str(stale.id)] and stale.state == S.STARTING and fresh.state == S.QUEUED


def test_one_unreachable_job_does_not_stop_the_others_from_being_checked(experiment, jobs):
    broken = make_run(experiment, S.RUNNING)
    other = make_run(experiment, S.RUNNING)

    class Flaky(FakeJobs):
        def status(self, run):
            if run.pk == broken.pk:
                raise ConnectionError("boom")
            return super().status(run)

    flaky = Flaky()
    flaky.statuses[str(other.id)] = "SUCCEEDED"
    services.runs_reconcile(jobs=flaky)
    other.refresh_from_db()
    broken.refresh_from_db()
    assert other.state == S.SUCCEEDED and broken.state == S.RUNNING


def test_terminal_runs_are_not_touched(experiment, jobs):
    run = reconciled(make_run(experiment, S.SUCCEEDED), jobs, "FAILED")
    assert run.state == S.SUCCEEDED


def test_under_admission_the_reconcile_admits_waiting_runs(experiment, jobs):
    from posttrain.scheduling.rules import ClusterNode, ClusterView

    run = make_run(experiment, S.QUEUED)
    view = ClusterView([ClusterNode("n0", "10.0.0.1", {"CPU": 1.0, "GPU": 0.0}, {"CPU": 1.0, "GPU": 0.0})])
    services.runs_reconcile(jobs=jobs, cluster=lambda: view)
    run.refresh_from_db()
    assert run.state == S.STARTING and jobs.submitted == [str(run.id)]


def test_an_admitted_run_whose_submit_was_lost_is_submitted_again_not_failed(experiment, jobs):
    run = reconciled(make_run(experiment, S.STARTING), jobs, None)
    assert run.state == S.STARTING and jobs.submitted == [str(run.id)]


def test_celery_beat_fails_stale_worker_jobs_every_30_seconds_on_the_runs_worker():
    from workers.celery_app import app

    entry = django_settings.CELERY_BEAT_SCHEDULE["worker-jobs-expire"]
    assert entry["task"] == "workers.worker_jobs_expire" and entry["schedule"] == 30
    app.loader.import_default_modules()
    assert "workers.worker_jobs_expire" in app.tasks
    # User code goes to its own queue, with Celery's time limits; everything else stays on the default one.
    trial = app.tasks["workers.reward_trial_run"]
    assert (trial.soft_time_limit, trial.time_limit) == (120, 150)
    judge = app.tasks["workers.review_judge_run"]
    assert (judge.soft_time_limit, judge.time_limit) == (1800, 1830)
    probe = app.tasks["workers.reward_probe_run"]
    assert (probe.soft_time_limit, probe.time_limit) == (120, 150)
    for name in ("workers.environment_generate", "workers.environment_trial_run"):
        assert app.tasks[name].time_limit is not None
    assert django_settings.CELERY_TASK_ROUTES == {
        "workers.reward_trial_run": {"queue": "user_code"},
        "workers.reward_probe_run": {"queue": "user_code"},
        "workers.review_judge_run": {"queue": "user_code"},
        "workers.environment_generate": {"queue": "user_code"},
        "workers.environment_trial_run": {"queue": "user_code"},
        "workers.model_import_run": {"queue": "user_code"},  # a GGUF is untrusted input
    }


def test_celery_beat_runs_the_reconcile_every_15_seconds():
    from workers.celery_app import app

    entry = django_settings.CELERY_BEAT_SCHEDULE["runs-reconcile"]
    assert entry["task"] == "workers.runs_reconcile" and entry["schedule"] == 15
    app.loader.import_default_modules()
    assert "workers.runs_reconcile" in app.tasks and app.conf.beat_schedule == django_settings.CELERY_BEAT_SCHEDULE
