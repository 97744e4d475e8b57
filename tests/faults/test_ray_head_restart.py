"""The Ray head SIGKILLed mid-run and started again: the run it was running fails saying the cluster lost
its job, a run launched while Ray is down waits queued and runs once the head is back."""

from __future__ import annotations

import psutil
import pytest

from tests.faults.invariants import assert_run_ended_truthfully, engine_processes, wait_for_engine
from tests.support.api import create_experiment, launch, run_config

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_ray_head_crash_fails_its_running_run_truthfully_and_a_queued_run_goes_on_when_ray_is_back(
    api, registry, stack, ray_head_server
):
    running = launch(api, create_experiment(api, registry, "head crash", run_config(1000)))
    running = api.wait_for(
        running["id"], lambda r: r["state"] == "running" and (r["last_step"] or 0) >= 1, what="a step"
    )
    wait_for_engine(running)

    ray_head_server.kill()
    queued = launch(api, create_experiment(api, registry, "launched while ray is down", run_config(3)), seed=2)
    psutil.wait_procs(engine_processes(running), timeout=30)  # the engine goes down with the head
    assert api.get(f"/api/runs/{queued['id']}/")["state"] == "queued"
    ray_head_server.start()

    assert_run_ended_truthfully(api, stack, running["id"], "failed", "was the Ray cluster restarted?")
    assert_run_ended_truthfully(api, stack, queued["id"], "succeeded", "engine finished every step", timeout_s=180)
