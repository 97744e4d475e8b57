"""What must hold after any fault: every run in a true state with a reason a person understands, the
platform's events exactly the run folder's events.jsonl, and nothing of the run left running."""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from tests.support.api import Api, assert_store_matches_the_run_folder, ray_state
from tests.support.stack import PlatformStack, ray_get_json

SETTLE_S = 60


def ray_jobs(stack: PlatformStack) -> list[dict]:
    return ray_get_json(f"{stack.ray}/api/jobs/")


def engine_processes(run: dict) -> list[psutil.Process]:
    """The run's engine (`python -m rl_engine train … --run-dir <its folder>`), wherever Ray started it."""
    run_dir = str(Path(run["resolved_config"]["logging"]["run_dir"]))
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "rl_engine" in cmdline and "train" in cmdline and run_dir in cmdline:
            found.append(process)
    return found


def wait_for_engine(run: dict, timeout_s: float = 60) -> psutil.Process:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        processes = [p for p in engine_processes(run) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if processes:
            return processes[0]
        time.sleep(0.1)
    raise AssertionError(f"no engine process of run {run['id']} appeared within {timeout_s}s")


def assert_nothing_left_running(stack: PlatformStack, run: dict, timeout_s: float = SETTLE_S) -> None:
    """No engine process of the run, no Ray job of it still going, no role actor alive (tests run one at a
    time on the stack, so any live `…Worker` actor is a leftover)."""
    deadline = time.monotonic() + timeout_s
    while True:
        engines = [p.pid for p in engine_processes(run) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        jobs = [j for j in ray_jobs(stack) if j.get("submission_id") == run["id"]]
        going = [j["status"] for j in jobs if j["status"] in ("PENDING", "RUNNING")]
        actors = [a["class_name"] for a in ray_state(stack, "actors") if a["state"] == "ALIVE"]
        actors = [name for name in actors if name.endswith("Worker")]
        if not engines and not going and not actors:
            assert len(jobs) <= 1, f"run {run['id']} has {len(jobs)} Ray jobs: it was started twice"
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"left running after run {run['id']}: engines {engines}, jobs {going}, actors {actors}"
            )
        time.sleep(0.5)


def assert_run_ended_truthfully(
    api: Api, stack: PlatformStack, run_id: str, state: str, reason: str, *, timeout_s: float = 150
) -> dict:
    """The run settled in `state` with a reason containing `reason`; every transition says why; its stored
    events are its events.jsonl, once each; nothing of it runs on."""
    run = api.wait_until_finished(run_id, timeout_s=timeout_s)
    assert run["state"] == state, (run["state"], run["state_reason"])
    assert reason in run["state_reason"], run["state_reason"]
    transitions = api.get(f"/api/runs/{run_id}/transitions/")
    assert all(t["reason"].strip() for t in transitions), transitions
    assert_store_matches_the_run_folder(run)
    assert_nothing_left_running(stack, run)
    return run
