"""Preemption on the database (posttrain.scheduling.services): a fake cluster view and Jobs client stand
in for Ray; tests/integration/test_scheduler.py preempts and resumes real runs on a real Ray head."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.runs import services
from posttrain.runs.models import Run
from posttrain.runs.services.state_machine import S
from posttrain.scheduling import services as scheduling_services
from posttrain.scheduling.models import Preemption
from posttrain.scheduling.services import runs_admit
from posttrain.telemetry.event_schema import parse_batch
from posttrain.telemetry.ingestion import events_ingest
from tests.unit.platform.helpers import FakeJobs, cluster, event, launch, state

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]


def running(experiment, user, priority: str = "low", state: str = S.RUNNING, **fields) -> Run:
    """A run admitted and holding its one CPU (the test config's need) on the cluster."""
    run = launch(experiment, user, state=state, priority=priority, **fields)
    run.refresh_from_db()
    return run


def engine_says(run: Run, status: dict) -> None:
    run.refresh_from_db()
    events_ingest(run.pk, parse_batch({"events": [event(run, run.last_seq + 1, "status", 1, status)]}, str(run.pk)))


def test_a_high_priority_run_that_cannot_fit_preempts_the_youngest_low_one_and_says_so(experiment, researcher):
    old_low = running(experiment, researcher, "low")
    young_low = running(experiment, researcher, "low")
    high = launch(experiment, researcher, priority="high")
    jobs = FakeJobs()

    assert runs_admit(cluster=cluster(2.0), jobs=jobs) == []
    assert (state(old_low), state(young_low)) == (S.RUNNING, S.PREEMPTING)
    assert jobs.preempted == [young_low.ray_job_id], "its engine is asked to checkpoint and exit"
    assert young_low.transitions.last().reason.startswith("preempted for ")
    assert "(high priority, needs 1 CPU)" in young_low.transitions.last().reason
    high.refresh_from_db()
    assert high.queue_reason == "needs 1 CPU, 0 free; preempting lower-priority runs to make room"

    # A second pass waits for the room on its way instead of preempting another run.
    assert runs_admit(cluster=cluster(2.0), jobs=jobs) == [] and state(old_low) == S.RUNNING
    assert jobs.preempted == [young_low.ray_job_id]


def test_equal_priorities_opted_out_runs_and_a_switched_off_preemption_preempt_nothing(
    experiment, researcher, settings
):
    running(experiment, researcher, "normal")
    pinned = running(experiment, researcher, "low", preemptible=False)
    launch(experiment, researcher, priority="normal")
    jobs = FakeJobs()
    runs_admit(cluster=cluster(2.0), jobs=jobs)
    assert jobs.preempted == [] and state(pinned) == S.RUNNING

    low = running(experiment, researcher, "low")
    launch(experiment, researcher, priority="high")
    settings.SCHEDULER_PREEMPTION = False
    runs_admit(cluster=cluster(3.0), jobs=jobs)
    assert jobs.preempted == [] and state(low) == S.RUNNING


def test_a_preempted_run_waits_in_the_queue_and_resumes_as_its_next_ray_job(experiment, researcher, storage):
    low = running(experiment, researcher, "low")
    high = launch(experiment, researcher, priority="high")
    jobs = FakeJobs()
    runs_admit(cluster=cluster(1.0), jobs=jobs)
    assert state(low) == S.PREEMPTING

    checkpoint = f"{low.resolved_config['logging']['run_dir']}/checkpoints/step_1"
    engine_says(low, {"state": "preempted", "reason": "checkpointed after step 1 (…)", "checkpoint": checkpoint})
    assert state(low) == S.PREEMPTED and low.state_reason == "preempted: checkpointed after step 1 (…)"
    record = Preemption.objects.get(run=low)
    assert (record.forced, record.resumed_step, record.lost_steps) == (False, 1, 0) and record.settled_at
    assert "high priority" in record.reason

    # The room it made goes to the high-priority run; the preempted one waits behind it.
    assert runs_admit(cluster=cluster(1.0), jobs=jobs) == [str(high.pk)]
    low.refresh_from_db()
    assert (low.queue_position, low.queue_reason) == (1, "needs 1 CPU, 0 free")

    services.run_transition(high.pk, [S.STARTING], S.SUCCEEDED, "done")
    assert runs_admit(cluster=cluster(1.0), jobs=jobs) == [str(low.pk)]
    low.refresh_from_db()
    assert (low.state, low.attempt, low.ray_job_id) == (S.STARTING, 1, f"{low.pk}-1")
    assert jobs.submitted[-1] == f"{low.pk}-1", "a new Ray job: the first one's submission id is spent"
    assert low.transitions.last().reason == "admitted: granted 1 CPU; resumes from its preemption checkpoint"

    from workers.ray_jobs import entrypoint

    folder = Path(low.resolved_config["logging"]["run_dir"]) / "checkpoints" / "step_1"
    folder.mkdir(parents=True)  # the checkpoint the engine wrote on its way out
    assert entrypoint(low, storage / "config.yaml").endswith(f"--resume {folder}")


def test_a_run_that_ends_before_its_step_boundary_just_ends(experiment, researcher):
    low = running(experiment, researcher, "low")
    launch(experiment, researcher, priority="high")
    runs_admit(cluster=cluster(1.0), jobs=FakeJobs())
    engine_says(low, {"state": "succeeded"})
    assert state(low) == S.SUCCEEDED


def test_the_reconcile_reads_exit_code_75_as_a_preemption_and_any_other_failure_as_a_failure(experiment, researcher):
    jobs = FakeJobs()
    preempted = running(experiment, researcher, "low", state=S.PREEMPTING)
    crashed = running(experiment, researcher, "low", state=S.PREEMPTING)
    for run, code in ((preempted, 75), (crashed, 1)):
        jobs.statuses[run.ray_job_id], jobs.exit_codes[run.ray_job_id] = "FAILED", code
        scheduling_services.run_reconcile(run, jobs=jobs)
    assert state(preempted) == S.PREEMPTED and "checkpointed and exited" in preempted.state_reason
    assert state(crashed) == S.FAILED and "exited with code 1" in crashed.state_reason


def test_a_preempting_run_whose_job_still_runs_is_asked_again(experiment, researcher):
    jobs = FakeJobs()
    run = running(experiment, researcher, "low", state=S.PREEMPTING)
    jobs.statuses[run.ray_job_id] = "RUNNING"
    scheduling_services.run_reconcile(run, jobs=jobs)
    assert jobs.preempted == [run.ray_job_id] and state(run) == S.PREEMPTING


def test_cancel_while_preempted_ends_at_once_and_while_preempting_stops_the_job(
    experiment, researcher, no_dispatch, django_capture_on_commit_callbacks
):
    waiting = running(experiment, researcher, "low", state=S.PREEMPTED)
    leaving = running(experiment, researcher, "low", state=S.PREEMPTING)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.run_cancel(waiting, user=researcher).state == S.CANCELLED
        assert services.run_cancel(leaving, user=researcher).state == S.CANCELLING
    assert ("run_cancel", str(leaving.pk)) in no_dispatch and ("run_cancel", str(waiting.pk)) not in no_dispatch


def test_the_run_api_shows_the_attempt_and_its_ray_job(api, experiment, researcher):
    run = running(experiment, researcher, "low", attempt=2)
    body = api.get(f"/api/runs/{run.pk}/").json()
    assert (body["attempt"], body["ray_job_id"]) == (2, f"{run.pk}-2")


def test_a_preempted_run_admitted_again_is_not_lost_for_the_time_it_waited_in_the_queue(experiment, researcher):
    from datetime import timedelta

    from django.utils import timezone

    long_ago = timezone.now() - timedelta(seconds=600)  # its last event, before it was preempted and waited
    run = running(experiment, researcher, "low", state=S.PREEMPTED, attempt=0, last_event_at=long_ago)
    jobs = FakeJobs()
    assert runs_admit(cluster=cluster(1.0), jobs=jobs) == [str(run.pk)]
    jobs.statuses[f"{run.pk}-1"] = "RUNNING"  # its new job runs; the engine is still loading
    scheduling_services.run_reconcile(run, jobs=jobs)
    assert state(run) == S.STARTING and jobs.stopped == []
