"""A run whose engine was SIGKILLed between checkpoints, resumed from its last one: the new run goes on
at the step after the checkpoint with the prompts the crashed run had there (the data position is in the
checkpoint), and both runs end in a true state."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.faults.invariants import assert_run_ended_truthfully, wait_for_engine
from tests.support.api import Api, create_experiment, launch, run_config, run_folder_events

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EVERY = 4  # steps between checkpoints: the kill lands two steps past one, well before the next


def prompts_by_step(run: dict) -> dict[int, list[str]]:
    """Each step's prompts, in rollout order, from the rollout files the run's samples events announce."""
    from posttrain_sdk.rollout_files import read_table

    folder = Path(run["resolved_config"]["logging"]["rollouts_dir"])
    return {
        e["step"]: read_table(folder / e["data"]["file"], columns=["prompt"]).column("prompt").to_pylist()
        for e in run_folder_events(run)
        if e["type"] == "samples"
    }


def wait_for_steps_past_a_checkpoint(run: dict, past: int, timeout_s: float = 120) -> None:
    """Until the run folder holds a checkpoint and `past` steps of samples after it."""
    events_path = Path(run["resolved_config"]["logging"]["run_dir"]) / "events.jsonl"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if events_path.exists():
            events = run_folder_events(run)
            checkpoints = [e["step"] for e in events if e["type"] == "checkpoint"]
            sampled = [e["step"] for e in events if e["type"] == "samples"]
            if checkpoints and max(sampled, default=0) >= checkpoints[-1] + past:
                return
        time.sleep(0.02)
    raise AssertionError(f"run {run['id']} did not get {past} steps past a checkpoint within {timeout_s}s")


def wait_for_samples_of(run: dict, steps: list[int], timeout_s: float = 60) -> None:
    """Until the run folder's events announce the rollout files of `steps`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if set(steps) <= {e["step"] for e in run_folder_events(run) if e["type"] == "samples"}:
            return
        time.sleep(0.05)
    raise AssertionError(f"run {run['id']} did not announce the rollouts of steps {steps} within {timeout_s}s")


def test_a_crashed_run_resumed_from_its_last_checkpoint_goes_on_at_the_next_step_with_the_same_prompts(
    api: Api, registry, stack
):
    config = run_config(1000, checkpoint={"every_steps": EVERY, "keep_last": 2, "save_final": False})
    crashed = launch(api, create_experiment(api, registry, "resume after a crash", config))
    crashed = api.wait_for(crashed["id"], lambda r: r["state"] == "running", what="running")
    engine = wait_for_engine(crashed)
    wait_for_steps_past_a_checkpoint(crashed, past=2)
    engine.send_signal(signal.SIGKILL)
    crashed = assert_run_ended_truthfully(api, stack, crashed["id"], "failed", "driver died", timeout_s=60)

    checkpoint = max(api.get(f"/api/runs/{crashed['id']}/checkpoints/"), key=lambda c: c["step"])
    assert checkpoint["available"], checkpoint
    resumed = api.post(f"/api/runs/{crashed['id']}/resume/", {"checkpoint": checkpoint["id"]})
    assert f"step {checkpoint['step']}" in resumed["state_reason"], resumed["state_reason"]
    crashed_prompts = prompts_by_step(crashed)
    compared = [s for s in crashed_prompts if s > checkpoint["step"]]
    assert compared, "the crashed run had no step after its last checkpoint"
    resumed = api.wait_for(
        resumed["id"], lambda r: (r["last_step"] or 0) >= max(compared), what=f"step {max(compared)}"
    )
    # A step's rollout file is announced by the engine's writer thread just after the step's metrics.
    wait_for_samples_of(resumed, compared)
    api.post(f"/api/runs/{resumed['id']}/cancel/", expect=200)

    resumed = assert_run_ended_truthfully(api, stack, resumed["id"], "cancelled", "cancel")
    resumed_events = run_folder_events(resumed)
    assert min(e["step"] for e in resumed_events if e["type"] == "metrics") == checkpoint["step"] + 1
    resumed_prompts = prompts_by_step(resumed)
    assert [resumed_prompts[s] for s in compared] == [crashed_prompts[s] for s in compared]
