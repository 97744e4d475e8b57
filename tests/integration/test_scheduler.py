"""The scheduler on the real stack (uvicorn, a Celery worker with beat, Postgres, Redis and the session's
Ray head of 2 CPUs): runs that do not fit wait with a reason and start one after another, in
priority order, each with Ray reserving exactly the CPUs admission counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.test_run_lifecycle import (  # noqa: F401  (fixtures)
    Api,
    _after_each_test,
    api,
    create_experiment,
    demo_assets,
    registry,
    run_config,
    stack,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Each run takes both CPUs of the test head: only one fits at a time.
WHOLE_HEAD = {"placement": {"cpus_per_trainer": 2, "cpus_per_rollout_engine": 2}}


def launch(api: Api, experiment: dict, priority: str) -> dict:  # noqa: F811  (the lifecycle module's fixtures, imported above)
    return api.post(f"/api/experiments/{experiment['id']}/launch/", {"seed": 1, "priority": priority})


def queue_with_the_cli(api: Api) -> dict:  # noqa: F811  (the lifecycle module's fixtures, imported above)
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


def admitted_at(api: Api, run_id: str) -> str:  # noqa: F811  (the lifecycle module's fixtures, imported above)
    moves = api.get(f"/api/runs/{run_id}/transitions/")
    return next(t["at"] for t in moves if t["to_state"] == "starting")


def test_runs_that_do_not_fit_wait_with_a_reason_and_start_one_after_another_by_priority(api, registry):  # noqa: F811  (the lifecycle module's fixtures, imported above)
    experiment = create_experiment(api, registry, "whole head", run_config(6, **WHOLE_HEAD))
    first = launch(api, experiment, "normal")
    api.wait_for(first["id"], lambda r: r["state"] == "running", what="running")
    low = launch(api, experiment, "low")
    high = launch(api, experiment, "high")

    # Both wait: the high one first, saying what it lacks; the low one behind it.
    waiting = api.wait_for(low["id"], lambda r: r["queue_position"] == 2, what="second in the queue")
    assert waiting["state"] == "queued" and waiting["queue_reason"] == "needs 2 CPUs, 0 free; 1 run ahead"
    assert api.get(f"/api/runs/{high['id']}/")["queue_reason"] == "needs 2 CPUs, 0 free"
    queue = queue_with_the_cli(api)
    assert [r["id"] for r in queue["waiting"]] == [high["id"], low["id"]]
    assert [(r["id"], r["grant"]["CPU"]) for r in queue["running"]] == [(first["id"], 2.0)]
    assert queue["cluster"]["nodes"][0]["total"]["CPU"] == 2.0

    finished = [api.wait_until_finished(run["id"], timeout_s=300) for run in (first, high, low)]
    assert [r["state"] for r in finished] == ["succeeded"] * 3, [r["state_reason"] for r in finished]
    # Never two at once: each started after the one before it ended, high before low.
    assert finished[0]["finished_at"] <= admitted_at(api, high["id"])
    assert finished[1]["finished_at"] <= admitted_at(api, low["id"])
    reasons = [t["reason"] for t in api.get(f"/api/runs/{low['id']}/transitions/")]
    assert "admitted: granted 2 CPUs" in reasons
