"""The run state machine: compare-and-set transitions with reasons, cancel, and the Ray dispatch
services against a fake Jobs API (the real one is exercised in tests/integration)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from posttrain.core.errors import JobsUnavailable
from posttrain.runs import services
from posttrain.runs.models import Run, RunState, RunTransition
from posttrain.scheduling import services as scheduling_services
from tests.unit.platform.helpers import FakeJobs, make_run, unknown_run_id

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]
S = RunState


def states(run: Run) -> list[tuple[str, str]]:
    return list(RunTransition.objects.filter(run=run).values_list("from_state", "to_state"))


def test_a_move_seals_in_its_transaction_then_tells_the_page_then_admits_after_commit(
    experiment, monkeypatch, settings, django_capture_on_commit_callbacks
):
    # What telemetry and scheduling register on posttrain.runs.hooks, in the order the state machine ran it itself.
    from posttrain.core import dispatch
    from posttrain.telemetry import live_channel, series

    settings.SCHEDULER = "admission"
    calls: list[str] = []
    monkeypatch.setattr(series, "seal_tail", lambda run_id: calls.append("seal"))
    monkeypatch.setattr(live_channel, "publish", lambda run_id, events: calls.append(f"publish {events[0]['state']}"))
    monkeypatch.setattr(dispatch, "run_task", lambda name, run_id: calls.append(name))
    run = make_run(experiment, state=S.RUNNING)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.run_transition(run.id, [S.RUNNING], S.SUCCEEDED, "done")
        assert calls == ["seal"]  # under the row lock, before commit
    assert calls == ["seal", "publish succeeded", "admit_runs"]


def test_a_revived_run_is_told_to_its_page_and_neither_sealed_nor_admitted(
    experiment, monkeypatch, django_capture_on_commit_callbacks
):
    from posttrain.core import dispatch
    from posttrain.telemetry import live_channel, series

    calls: list[str] = []
    monkeypatch.setattr(series, "seal_tail", lambda run_id: calls.append("seal"))
    monkeypatch.setattr(live_channel, "publish", lambda run_id, events: calls.append(f"publish {events[0]['state']}"))
    monkeypatch.setattr(dispatch, "run_task", lambda name, run_id: calls.append(name))
    run = make_run(experiment, state=S.FAILED, kind="external", state_reason="lost: no event for 30s")
    with django_capture_on_commit_callbacks(execute=True):
        assert services.run_revive_lost(run.id)
    assert calls == ["publish running"]


def test_a_transition_changes_the_state_once_and_records_its_reason(experiment):
    run = make_run(experiment)
    assert services.run_transition(run.id, [S.QUEUED], S.STARTING, "Ray job submitted") is True
    assert services.run_transition(run.id, [S.QUEUED], S.STARTING, "again") is False  # no longer queued
    run.refresh_from_db()
    assert (run.state, run.state_reason) == (S.STARTING, "Ray job submitted")
    assert states(run) == [("draft", "queued"), ("queued", "starting")]
    assert RunTransition.objects.filter(run=run).last().reason == "Ray job submitted"


def test_terminal_transitions_stamp_start_and_finish_times(experiment):
    run = make_run(experiment, S.STARTING)
    services.run_transition(run.id, [S.STARTING], S.RUNNING, "engine started")
    services.run_transition(run.id, [S.RUNNING], S.SUCCEEDED, "done")
    run.refresh_from_db()
    assert run.started_at is not None and run.finished_at >= run.started_at


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (S.SUCCEEDED, S.RUNNING),
        (S.FAILED, S.QUEUED),
        (S.CANCELLED, S.CANCELLING),
        (S.RUNNING, S.QUEUED),
        (S.CANCELLING, S.RUNNING),
        (S.DRAFT, S.RUNNING),
    ],
)
def test_illegal_transitions_are_refused(experiment, old, new):
    run = make_run(experiment, old)
    with pytest.raises(ValueError, match="not a transition"):
        services.run_transition(run.id, [old], new, "no")
    run.refresh_from_db()
    assert run.state == old


@pytest.mark.django_db(transaction=True)
def test_concurrent_transitions_of_one_run_only_one_wins(experiment):
    if connection.vendor != "postgresql":
        pytest.skip("needs a database with concurrent writers (Postgres)")
    run = make_run(experiment, S.RUNNING)
    targets = [S.SUCCEEDED, S.FAILED, S.CANCELLING, S.CANCELLED] * 2
    barrier = threading.Barrier(len(targets))
    results: dict[int, bool] = {}

    def attempt(i: int, target: str) -> None:
        try:
            barrier.wait()
            results[i] = services.run_transition(run.id, [S.RUNNING], target, f"thread {i}")
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt, args=(i, t)) for i, t in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results.values()) == [False] * (len(targets) - 1) + [True]
    winner = next(i for i, won in results.items() if won)
    run.refresh_from_db()
    assert run.state == targets[winner] and run.state_reason == f"thread {winner}"
    assert RunTransition.objects.filter(run=run, from_state=S.RUNNING).count() == 1


@pytest.mark.parametrize("state", [S.SUCCEEDED, S.FAILED, S.CANCELLED])
def test_cancel_of_finished_run_is_refused(api, experiment, state):
    run = make_run(experiment, state)
    response = api.post(f"/api/runs/{run.id}/cancel/")
    assert response.status_code == 409
    assert response.json()["state"] == state and "already ended" in response.json()["errors"][0]["msg"]
    run.refresh_from_db()
    assert run.state == state


@pytest.mark.parametrize("state", [S.STARTING, S.RUNNING, S.PREEMPTING])
def test_cancel_of_an_active_run_goes_to_cancelling_and_stops_the_job_after_commit(
    api, experiment, no_dispatch, django_capture_on_commit_callbacks, state
):
    run = make_run(experiment, state)
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"/api/runs/{run.id}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == S.CANCELLING
    assert no_dispatch == [("run_cancel", str(run.id))]
    assert RunTransition.objects.filter(run=run).last().reason == "cancel requested by ada"
    # Cancelling twice is harmless: still cancelling, nothing dispatched again.
    with django_capture_on_commit_callbacks(execute=True):
        assert api.post(f"/api/runs/{run.id}/cancel/").status_code == 200
    assert no_dispatch == [("run_cancel", str(run.id))]


@pytest.mark.parametrize("state", [S.QUEUED, S.PREEMPTED])
def test_cancel_of_a_waiting_run_ends_it_at_once_with_no_job_to_stop(
    api, experiment, no_dispatch, django_capture_on_commit_callbacks, state
):
    run = make_run(experiment, state)
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"/api/runs/{run.id}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == S.CANCELLED
    assert no_dispatch == []  # it held nothing: no job to stop, nothing freed for admission


def test_cancel_of_a_queued_run_under_all_at_once_stops_its_job(api, experiment, no_dispatch, settings):
    settings.SCHEDULER = "all-at-once"  # its job may already be waiting in Ray
    run = make_run(experiment)
    assert api.post(f"/api/runs/{run.id}/cancel/").json()["state"] == S.CANCELLING


def test_cancel_of_an_unknown_run_is_404(api):
    assert api.post("/api/runs/00000000-0000-0000-0000-000000000000/cancel/").status_code == 404
    assert api.post("/api/runs/not-a-uuid/cancel/").status_code == 404


# --- dispatch (the worker's services) -------------------------------------------------------


def test_submit_moves_a_queued_run_to_starting_and_a_repeated_submit_does_nothing(experiment):
    jobs = FakeJobs()
    run = make_run(experiment)
    scheduling_services.run_submit(run.id, jobs=jobs)
    scheduling_services.run_submit(run.id, jobs=jobs)  # a redelivered task: the run is no longer queued
    run.refresh_from_db()
    assert run.state == S.STARTING and jobs.submitted == [str(run.id)]


def test_a_failed_submit_fails_the_run_with_the_reason(experiment):
    jobs = FakeJobs()
    jobs.fail_submit = RuntimeError("Request failed with status code 400: invalid runtime_env")
    run = make_run(experiment)
    scheduling_services.run_submit(run.id, jobs=jobs)
    run.refresh_from_db()
    assert run.state == S.FAILED and "invalid runtime_env" in run.state_reason


def test_a_submit_ray_cannot_take_yet_keeps_the_run_queued_for_a_retry(experiment):
    jobs = FakeJobs()
    jobs.fail_submit = JobsUnavailable("No available agent to submit job, please try again later.")
    run = make_run(experiment)
    with pytest.raises(JobsUnavailable):  # the Celery task retries on it
        scheduling_services.run_submit(run.id, jobs=jobs)
    run.refresh_from_db()
    assert run.state == S.QUEUED


def test_a_run_ray_never_accepts_fails_after_the_submit_timeout(experiment, settings):
    settings.RUN_SUBMIT_TIMEOUT_S = 0
    jobs = FakeJobs()
    jobs.fail_submit = JobsUnavailable("Connection refused")
    run = make_run(experiment)
    scheduling_services.run_submit(run.id, jobs=jobs)
    run.refresh_from_db()
    assert (
        run.state == S.FAILED
        and "did not accept the job" in run.state_reason
        and "Connection refused" in run.state_reason
    )


@pytest.mark.parametrize(
    "message, transient",
    [
        ("Request failed with status code 500: No available agent to submit job, please try again later.", True),
        ("Request failed with status code 503: Service Unavailable", True),
        ("Request failed with status code 400: invalid runtime_env", False),
    ],
)
def test_ray_errors_worth_retrying_are_told_apart_from_permanent_ones(message, transient):
    from workers.ray_jobs import _transient

    assert _transient(RuntimeError(message)) is transient


def test_a_run_cancelled_while_it_was_submitted_has_its_job_stopped(experiment, settings):
    settings.SCHEDULER = "all-at-once"
    run = make_run(experiment)

    class CancelDuringSubmit(FakeJobs):
        def submit(self, r):
            services.run_cancel(Run.objects.get(pk=r.pk))  # the user clicks cancel meanwhile
            return super().submit(r)

    jobs = CancelDuringSubmit()
    scheduling_services.run_submit(run.id, jobs=jobs)
    run.refresh_from_db()
    assert jobs.stopped == [str(run.id)] and run.state == S.CANCELLED


def test_submit_of_a_missing_run_is_a_no_op(experiment):
    """A task whose run was deleted meanwhile: nothing asks Ray for anything, and no run changes state."""
    waiting = make_run(experiment)
    before = list(RunTransition.objects.values_list("pk", flat=True))

    class RecordsEveryCall(FakeJobs):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        def submit(self, run):
            self.calls.append("submit")
            return super().submit(run)

        def stop(self, run):
            self.calls.append("stop")
            return super().stop(run)

        def status(self, run):
            self.calls.append("status")
            return super().status(run)

    jobs = RecordsEveryCall()
    scheduling_services.run_submit(unknown_run_id(), jobs=jobs)

    waiting.refresh_from_db()
    assert jobs.calls == [] and jobs.submitted == []
    assert waiting.state == S.QUEUED and list(RunTransition.objects.values_list("pk", flat=True)) == before


def test_stop_stops_the_job_and_ends_the_run_cancelled(experiment):
    jobs = FakeJobs()
    run = make_run(experiment, S.CANCELLING)
    jobs.statuses[str(run.id)] = "RUNNING"
    scheduling_services.run_stop(run.id, jobs=jobs, wait_s=1)
    run.refresh_from_db()
    assert jobs.stopped == [str(run.id)] and run.state == S.CANCELLED


def test_stop_leaves_a_slow_job_cancelling_for_the_reconcile_to_finish(experiment):
    jobs = FakeJobs()
    jobs.stop_sets = None  # Ray has not stopped it yet
    run = make_run(experiment, S.CANCELLING)
    jobs.statuses[str(run.id)] = "RUNNING"
    scheduling_services.run_stop(run.id, jobs=jobs, wait_s=0.2)
    run.refresh_from_db()
    assert run.state == S.CANCELLING
    jobs.statuses[str(run.id)] = "STOPPED"
    scheduling_services.runs_reconcile(jobs=jobs)
    run.refresh_from_db()
    assert run.state == S.CANCELLED
