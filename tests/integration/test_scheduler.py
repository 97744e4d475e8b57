"""The scheduler on the real stack (uvicorn, a Celery worker with beat, Postgres, Redis and the session's
Ray head of 2 CPUs): runs that do not fit wait with a reason and start one after another, in
priority order, each with Ray reserving exactly the CPUs admission counted; a higher-priority run
preempts a lower one, which resumes later exactly where it stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.api import (
    Api,
    admitted_at,
    assert_store_matches_the_run_folder,
    create_experiment,
    ray_job_status,
    run_config,
    run_folder_events,
)
from tests.support.stack_fixtures import api, check_after_test, demo_assets, registry, stack  # noqa: F401  (fixtures)

# A test's `api`, `registry` or `stack` parameter is pytest handing it the fixture imported above, not a
# redefinition of the import.
# ruff: noqa: F811

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(autouse=True)
def _after_each_test(stack, api) -> Iterator[None]:
    """tests/support/stack_fixtures.py's check_after_test after each test: no request was a 500, and no run
    is left going into the next test."""
    yield
    check_after_test(stack, api)


# Each run takes both CPUs of the test head: only one fits at a time.
WHOLE_HEAD = {"placement": {"cpus_per_trainer": 2, "cpus_per_rollout_engine": 2}}


def launch(api: Api, experiment: dict, priority: str) -> dict:
    return api.post(f"/api/experiments/{experiment['id']}/launch/", {"seed": 1, "priority": priority})


def queue_with_the_cli(api: Api) -> dict:
    env = {**os.environ, "POSTTRAIN_URL": api.base, "POSTTRAIN_TOKEN": api.session.headers["Authorization"].split()[1]}
    done = subprocess.run(
        [sys.executable, "-m", "posttrain_sdk", "queue", "ls", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_runs_that_do_not_fit_wait_with_a_reason_and_start_one_after_another_by_priority(api, registry):
    # The first run holds the head until the test cancels it: the queue is looked at while it surely runs,
    # however slow the machine (a short one could end before the other two were even ordered).
    holder = create_experiment(api, registry, "holds the head", run_config(100_000, **WHOLE_HEAD))
    experiment = create_experiment(api, registry, "whole head", run_config(6, **WHOLE_HEAD))
    # The running run has the highest priority of the three, so nothing here is preempted.
    first = launch(api, holder, "high")
    api.wait_for(first["id"], lambda r: r["state"] == "running", what="running")
    low = launch(api, experiment, "low")
    high = launch(api, experiment, "normal")

    # Both wait: the normal one first, saying what it lacks; the low one behind it.
    waiting = api.wait_for(low["id"], lambda r: r["queue_position"] == 2, what="second in the queue")
    assert waiting["state"] == "queued" and waiting["queue_reason"] == "needs 2 CPUs, 0 free; 1 run ahead"
    assert api.get(f"/api/runs/{high['id']}/")["queue_reason"] == "needs 2 CPUs, 0 free"
    queue = queue_with_the_cli(api)
    assert [r["id"] for r in queue["waiting"]] == [high["id"], low["id"]]
    assert [(r["id"], r["grant"]["CPU"]) for r in queue["running"]] == [(first["id"], 2.0)]
    assert queue["cluster"]["nodes"][0]["total"]["CPU"] == 2.0
    # The snapshot counts the running run's grant, whatever Ray's lagging report said when it was taken.
    assert queue["cluster"]["free"]["CPU"] == 0.0 and queue["cluster"]["age_s"] is not None
    assert api.get(f"/api/runs/{first['id']}/")["state"] == "running"

    api.post(f"/api/runs/{first['id']}/cancel/", expect=200)
    finished = [api.wait_until_finished(run["id"], timeout_s=300) for run in (first, high, low)]
    states = [r["state"] for r in finished]
    assert states == ["cancelled", "succeeded", "succeeded"], [r["state_reason"] for r in finished]
    # Never two at once: each started after the one before it ended, normal before low.
    assert finished[0]["finished_at"] <= admitted_at(api, high["id"])
    assert finished[1]["finished_at"] <= admitted_at(api, low["id"])
    reasons = [t["reason"] for t in api.get(f"/api/runs/{low['id']}/transitions/")]
    assert "admitted: granted 2 CPUs" in reasons


def comparable_metrics(run: dict) -> dict[int, dict]:
    """The run's metrics by step from its run folder, wall-clock ones left out (they differ between runs)."""
    from tests.unit.engine.helpers import comparable

    return {e["step"]: comparable(e["data"]) for e in run_folder_events(run) if e["type"] == "metrics"}


def test_a_high_priority_run_preempts_a_low_one_which_resumes_later_exactly_where_it_stopped(api, registry, stack):
    # The low run must still be going when the high one's admission asks it to stop. How long that takes
    # depends on how busy the machine is, so a low run that ended first is tried again, four times longer
    # (alone on the machine 12 steps are plenty; under a loaded suite they were not).
    for steps in (12, 48, 192):
        experiment = create_experiment(api, registry, f"preemptible {steps}", run_config(steps, **WHOLE_HEAD))
        low = launch(api, experiment, "low")
        api.wait_for(low["id"], lambda r: r["state"] == "running", what="running")
        high = launch(api, experiment, "high")
        preempted = api.wait_for(
            low["id"], lambda r: r["state"] in ("preempted", "succeeded"), timeout_s=300, what="preempted"
        )
        if preempted["state"] == "preempted":
            break
        api.wait_until_finished(high["id"], timeout_s=300)
    assert preempted["state"] == "preempted", "the low run ended before the high one could preempt it"
    finished = [api.wait_until_finished(run["id"], timeout_s=600) for run in (high, low)]
    assert [r["state"] for r in finished] == ["succeeded", "succeeded"], [r["state_reason"] for r in finished]
    low = finished[1]

    # The run's history tells the whole story, and the high run ran while the low one waited.
    moves = api.get(f"/api/runs/{low['id']}/transitions/")
    assert [m["to_state"] for m in moves] == [
        "queued",
        "starting",
        "running",
        "preempting",
        "preempted",
        "starting",
        "running",
        "succeeded",
    ]
    assert moves[3]["reason"].startswith("preempted for ") and "high priority" in moves[3]["reason"]
    assert moves[5]["reason"].endswith("resumes from its preemption checkpoint")
    assert finished[0]["finished_at"] <= moves[5]["at"]
    assert (low["attempt"], low["ray_job_id"]) == (1, f"{low['id']}-1")
    assert ray_job_status(stack, low["id"]) == "FAILED"  # the first job exited 75 for the scheduler

    # Exact resume: every step once, each equal to the uninterrupted run's (the high one is that run: the same
    # experiment and seed, never interrupted); the platform stored exactly that.
    assert comparable_metrics(low) == comparable_metrics(finished[0])
    assert sorted(comparable_metrics(low)) == list(range(1, steps + 1))
    assert_store_matches_the_run_folder(low)
    # Its prompt ledger accounts for every row as the uninterrupted run's does, and shows the resume: from the
    # preemption checkpoint, nothing lost, nothing re-done (the run stopped at a step boundary).
    low_ledger, high_ledger = (api.get(f"/api/runs/{r['id']}/ledger/") for r in finished[::-1])
    assert low_ledger["epochs"] == high_ledger["epochs"]
    assert low_ledger["totals"]["skipped"] == low_ledger["totals"]["duplicates"] == 0
    [resume] = low_ledger["resumes"]
    assert resume["checkpoint_step"] == preempted["last_step"] and resume["redone_steps"] == []
    assert resume["lost_in_flight"] == 0 and not high_ledger["resumes"]
