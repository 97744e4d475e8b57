"""Replay (rl_engine/replay.py): a step's update rebuilt from its rollout file and the checkpoint before it
equals what the run logged; every file the run's folder holds was announced whole. (An engine killed while
it writes a file: tests/unit/platform/test_rollout_store.py.)"""

from __future__ import annotations

import pytest

from posttrain_sdk.event_log import read_events
from posttrain_sdk.rollout_files import parse_file_name
from rl_engine.__main__ import main
from rl_engine.config import validate_config
from rl_engine.loop import train
from rl_engine.replay import COMPARED, replay_step
from tests.unit.engine.helpers import tiny_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def replayable_run(tiny_demo, tmp_path_factory):
    """A tiny GRPO run with the KL in the loss (reference log-probs stored) and a checkpoint every step."""
    run_dir = tmp_path_factory.mktemp("replay") / "run"
    cfg = validate_config(
        tiny_config(
            tiny_demo,
            algorithm={"kl": {"coef": 0.05, "placement": "loss"}},
            train={"steps": 3, "lr": 3e-3, "micro_batch_size": 8},
            checkpoint={"every_steps": 1, "keep_last": 5},
            logging={"eval_every": 0},
        )
    )
    train(cfg, run_dir)
    return run_dir


@pytest.mark.parametrize("step", [1, 3])
def test_replaying_a_step_gives_the_logged_loss_kl_and_grad_norm(replayable_run, step):
    result = replay_step(replayable_run, step)
    assert set(result.replayed) == set(COMPARED) == set(result.logged)
    for name in COMPARED:
        assert result.replayed[name] == pytest.approx(result.logged[name], rel=1e-6, abs=1e-9), name


def test_the_replay_command_prints_each_metric_beside_the_logged_one(replayable_run, capsys):
    assert main(["replay", str(replayable_run), "--step", "2"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMPARED)


def test_a_step_without_the_checkpoint_before_it_is_refused_by_name(replayable_run, tmp_path, capsys):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(replayable_run, copy)
    shutil.rmtree(copy / "checkpoints" / "step_1")
    assert main(["replay", str(copy), "--step", "2"]) == 2
    assert "checkpoint of step 1" in capsys.readouterr().err


def test_every_file_in_the_folder_was_announced_and_is_whole(replayable_run):
    """The writer puts a file in place by renaming a finished temporary one, then announces it: the folder
    holds exactly the announced files, each with the rows its event says, and a temporary file's name is
    never taken for a step's."""
    from posttrain_sdk.rollout_files import read_table

    folder = replayable_run / "rollouts"
    announced = [e["data"] for e in read_events(replayable_run / "events.jsonl") if e["type"] == "samples"]
    assert [d["file"] for d in announced] == sorted(p.name for p in folder.iterdir() if parse_file_name(p.name))
    for data in announced:
        assert read_table(folder / data["file"]).num_rows == data["rows"]
    assert parse_file_name(".step_00000001.parquet.1a2b3c4d.partial") is None
