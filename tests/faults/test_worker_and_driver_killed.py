"""Faults of the worker side: the Celery worker SIGKILLed (while it submits a run, and while runs run) and
the Ray job's driver, the engine process, SIGKILLed mid-run."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.faults.invariants import assert_run_ended_truthfully, wait_for_engine
from tests.support.api import create_experiment, launch, run_config
from tests.support.stack import PlatformStack, start_celery_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SUCCEEDED = "engine finished every step"


def wait_for_line(log: Path, *parts: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(all(part in line for part in parts) for line in log.read_text().splitlines()):
            return
        time.sleep(0.02)
    raise AssertionError(f"no line with {parts} in {log} within {timeout_s}s:\n{log.read_text()[-2000:]}")


def replace_worker(stack: PlatformStack, log: Path) -> None:
    """SIGKILL the worker and its beat process (its process group, as a container's OOM kill would: the
    embedded beat is a child that would otherwise live on) and start another on the same queue."""
    os.killpg(stack.worker.pid, signal.SIGKILL)
    stack.worker.wait()
    stack.worker = start_celery_worker(stack.worker_env, log, log.with_suffix(".schedule"))
    stack.worker_log = log


def test_a_worker_killed_while_submitting_and_while_runs_run_is_replaced_and_every_run_succeeds(
    api, registry, stack, tmp_path
):
    experiment = create_experiment(api, registry, "worker killed", run_config(6))
    submitted = launch(api, experiment, seed=1)
    # The worker took the admission task (which submits the run) off the queue (acked late: still
    # unacknowledged) and is working on it.
    wait_for_line(stack.worker_log, "workers.admit_runs[", "received")
    replace_worker(stack, tmp_path / "worker-2.log")

    running = launch(api, create_experiment(api, registry, "worker killed mid-run", run_config(150)), seed=2)
    api.wait_for(running["id"], lambda r: r["state"] == "running" and (r["last_step"] or 0) >= 1, what="a step")
    replace_worker(stack, tmp_path / "worker-3.log")

    for run in (submitted, running):
        assert_run_ended_truthfully(api, stack, run["id"], "succeeded", SUCCEEDED)
    states = [t["to_state"] for t in api.get(f"/api/runs/{submitted['id']}/transitions/")]
    assert states in (["queued", "starting", "running", "succeeded"], ["queued", "running", "succeeded"]), states


def test_a_sigkilled_driver_fails_its_run_as_driver_died_with_its_log_tail_within_seconds(api, registry, stack):
    run = launch(api, create_experiment(api, registry, "driver killed", run_config(1000)))
    run = api.wait_for(run["id"], lambda r: r["state"] == "running" and (r["last_step"] or 0) >= 1, what="a step")
    engine = wait_for_engine(run)
    children = engine.children(recursive=True)
    engine.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()

    run = assert_run_ended_truthfully(api, stack, run["id"], "failed", "driver died", timeout_s=60)
    noticed_s = time.monotonic() - killed_at
    assert noticed_s < 20, f"noticed after {noticed_s:.0f}s: only by the heartbeat timeout"
    assert "SIGKILL" in run["state_reason"], run["state_reason"]
    assert "run folder:" in run["state_reason"], "no log tail in the reason"
    assert not [c.pid for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
