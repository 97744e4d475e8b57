"""Preemption in the engine (rl_engine/preemption.py): a request file in the run folder stops the run at
its next step boundary with a checkpoint and exit code 75, and resuming from that checkpoint continues
exactly the uninterrupted run."""

from __future__ import annotations

import pytest

from posttrain_sdk.event_log import read_events
from rl_engine.__main__ import main
from rl_engine.config import dump_config, validate_config
from rl_engine.loop import train
from rl_engine.preemption import (
    EXIT_PREEMPTED,
    EXIT_TIME_LIMIT,
    preemption_requested,
    request_path,
    request_preemption,
    time_limit_reason,
)
from tests.unit.engine.helpers import by_type, comparable, tiny_config

pytestmark = pytest.mark.slow


def test_a_request_is_read_with_its_reason_and_an_empty_one_still_counts(tmp_path):
    assert preemption_requested(tmp_path) is None
    request_preemption(tmp_path, "preempted for urgent-run")
    assert preemption_requested(tmp_path) == "preempted for urgent-run"
    request_path(tmp_path).write_text("")
    assert preemption_requested(tmp_path) == "preemption requested"


def test_a_preempted_run_exits_75_after_a_checkpoint_and_its_resume_equals_the_uninterrupted_run(tiny_demo, tmp_path):
    cfg = validate_config(
        tiny_config(
            tiny_demo,
            train={"steps": 3, "lr_schedule": "cosine", "warmup_steps": 1},
            checkpoint={"every_steps": 0, "save_final": False},
            logging={"eval_every": 3},
        )
    )
    train(cfg, tmp_path / "straight")
    straight = {e["step"]: e["data"] for e in by_type(read_events(tmp_path / "straight" / "events.jsonl"), "metrics")}

    config = tmp_path / "run.yaml"
    config.write_text(dump_config(cfg))
    run_dir = tmp_path / "preempted"
    request_preemption(run_dir, "preempted for a high-priority run")
    argv = ["train", str(config), "--run-dir", str(run_dir), "--no-progress"]

    assert main(argv) == EXIT_PREEMPTED
    events = read_events(run_dir / "events.jsonl")
    status = by_type(events, "status")
    assert [s["data"]["state"] for s in status] == ["running", "preempted"], "a preemption is not a failure"
    assert (
        status[-1]["step"] == 1 and "after step 1 (preempted for a high-priority run)" in status[-1]["data"]["reason"]
    )
    checkpoint = by_type(events, "checkpoint")[-1]
    assert checkpoint["step"] == 1 and status[-1]["data"]["checkpoint"] == checkpoint["data"]["path"]
    assert preemption_requested(run_dir) is None, "an honoured request is gone, or the resume would stop again"

    assert main([*argv, "--resume", checkpoint["data"]["path"]]) == 0
    events = read_events(run_dir / "events.jsonl")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), "seq continues after the resume"
    metrics = by_type(events, "metrics")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3], "no step repeated, none missing"
    for m in metrics:
        assert comparable(m["data"]) == comparable(straight[m["step"]]), f"step {m['step']} differs"
    assert [s["data"]["state"] for s in by_type(events, "status")][-1] == "succeeded"


def test_a_request_that_arrives_at_the_last_step_lets_the_run_finish(tiny_demo, tmp_path):
    cfg = validate_config(tiny_config(tiny_demo, train={"steps": 1}, logging={"eval_every": 0}))
    request_preemption(tmp_path / "run", "too late")
    train(cfg, tmp_path / "run")
    states = [s["data"]["state"] for s in by_type(read_events(tmp_path / "run" / "events.jsonl"), "status")]
    assert states == ["running", "succeeded"]


def test_a_run_past_its_time_limit_stops_with_a_checkpoint_and_that_reason(tiny_demo, tmp_path):
    cfg = validate_config(
        tiny_config(
            tiny_demo, train={"steps": 3, "max_wall_s": 1e-6}, checkpoint={"every_steps": 0, "save_final": False}
        )
    )
    config = tmp_path / "run.yaml"
    config.write_text(dump_config(cfg))
    run_dir = tmp_path / "limited"

    assert main(["train", str(config), "--run-dir", str(run_dir), "--no-progress"]) == EXIT_TIME_LIMIT
    events = read_events(run_dir / "events.jsonl")
    status = by_type(events, "status")[-1]
    assert status["data"]["state"] == "failed" and status["step"] == 1
    assert (
        status["data"]["reason"].startswith("time limit: ")
        and "train.max_wall_s is 1e-06 s" in status["data"]["reason"]
    )
    checkpoint = by_type(events, "checkpoint")[-1]
    assert checkpoint["step"] == 1 and status["data"]["checkpoint"] == checkpoint["data"]["path"]
    assert [m["step"] for m in by_type(events, "metrics") if m["step"]] == [1], "no step after the limit"


def test_the_time_limit_counts_training_time_and_is_off_when_unset():
    assert time_limit_reason(59.9, 60.0, 3) is None
    assert time_limit_reason(1e9, None, 3) is None
    assert time_limit_reason(60.0, 60.0, 3).endswith("stopped after step 3 with a checkpoint (resume the run to go on)")
