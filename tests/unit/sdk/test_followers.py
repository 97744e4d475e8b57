"""`posttrain track`'s followers on files written the way the engines write them, while they are being
written: TensorBoard event files from torch.utils.tensorboard (OpenRLHF's and verl's writer), verl's
file-logger JSONL; and the metric-name maps."""

from __future__ import annotations

import json
import math

import pytest

from posttrain_sdk import metric_names
from posttrain_sdk.errors import PosttrainError
from posttrain_sdk.followers import TensorBoardFollower, VerlJsonlFollower, follower_for
from posttrain_sdk.metric_names import openrlhf_name, tensorboard_name, trl_name, verl_name
from rl_engine.metric_catalogue import lookup


def test_tensorboard_event_files_are_followed_while_the_writer_appends(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    logdir = tmp_path / "tensorboard_log" / "proj" / "exp"
    follower = follower_for(tmp_path / "tensorboard_log")
    assert isinstance(follower, TensorBoardFollower) and follower.poll() == []  # nothing written yet
    writer = SummaryWriter(str(logdir), flush_secs=3600)
    for step in (1, 2):
        writer.add_scalar("train/reward", 0.1 * step, step)  # OpenRLHF's tags
        writer.add_scalar("train/kl", 0.01 * step, step)
        writer.add_text("train/generated_samples", "not a number", step)
    writer.flush()
    first = follower.poll()
    assert [step for step, _ in first] == [1, 2]
    assert first[1][1] == pytest.approx({"reward/mean": 0.2, "kl/mean": 0.02})
    assert follower.poll() == []  # nothing new
    writer.add_scalar("actor/entropy", 1.5, 3)  # verl's tensorboard logger writes its own names
    writer.add_scalar("critic/score/mean", float("nan"), 3)
    writer.flush()
    ((step, values),) = follower.poll()
    assert step == 3 and values["policy/entropy"] == 1.5 and math.isnan(values["reward/mean"])
    writer.close()


def test_a_half_written_tensorboard_record_is_read_once_it_is_complete(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "src"), flush_secs=3600)
    writer.add_scalar("train/reward", 0.5, 7)
    writer.close()
    (source,) = (tmp_path / "src").glob("events.out.tfevents.*")
    data = source.read_bytes()
    target = tmp_path / "dst" / source.name
    target.parent.mkdir()
    target.write_bytes(data[:-6])  # the last record cut mid-way, as a reader can catch a writer
    follower = TensorBoardFollower(tmp_path / "dst")
    assert follower.poll() == []
    target.write_bytes(data)
    assert follower.poll() == [(7, {"reward/mean": 0.5})]


def test_verl_jsonl_is_followed_line_by_line_and_a_torn_line_waits(tmp_path):
    path = tmp_path / "gsm8k" / "qwen.jsonl"
    follower = follower_for(path)
    assert isinstance(follower, VerlJsonlFollower) and follower.poll() == []  # the job has not started
    path.parent.mkdir()
    line = json.dumps(
        {"step": 1, "data": {"critic/score/mean": 0.4, "actor/pg_loss": -0.1, "val-core/gsm8k/acc/mean@1": 0.3}}
    )
    path.write_text(line + "\n" + '{"step": 2, "data": {"critic/score/me')
    assert follower.poll() == [(1, {"reward/mean": 0.4, "policy/loss": -0.1, "eval/gsm8k/acc/mean@1": 0.3})]
    with path.open("a") as f:
        f.write('an": 0.6, "timing_s/gen": 2.5, "perf/throughput": null, "raw": [1, 2]}}\n')
    assert follower.poll() == [(2, {"reward/mean": 0.6, "timing/generate": 2.5})]


def test_a_line_that_is_not_verl_format_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "data": {"a": 1}}) + "\n" + json.dumps({"loss": 1}) + "\n")
    with pytest.raises(PosttrainError, match=r"metrics.jsonl line 2: not a verl file-logger line"):
        VerlJsonlFollower(path).poll()


def test_an_unknown_file_kind_asks_for_the_format(tmp_path):
    with pytest.raises(PosttrainError, match="--format"):
        follower_for(tmp_path / "log.txt")


@pytest.mark.parametrize(
    ("engine_name", "ours", "rename"),
    [
        ("reward", "reward/mean", trl_name),
        ("rewards/correct/mean", "reward/correct", trl_name),
        ("rewards/correct/std", "reward/correct/std", trl_name),
        ("completions/clipped_ratio", "response/truncated_rate", trl_name),
        ("clip_ratio/region_mean", "policy/clip_ratio", trl_name),
        ("eval_reward", "eval/reward/mean", trl_name),
        ("some_new_metric", "some_new_metric", trl_name),
        ("actor/kl_loss", "kl/mean", verl_name),
        ("response_length/clip_ratio", "response/truncated_rate", verl_name),
        ("timing_s/update_actor", "timing/train", verl_name),
        ("timing_s/testing", "timing/testing", verl_name),
        ("train/policy_loss", "policy/loss", openrlhf_name),
        ("train/response_length", "response/length_mean", openrlhf_name),
        ("eval/reward", "eval/reward", openrlhf_name),
        ("train/loss", "policy/loss", tensorboard_name),  # TRL's report_to=tensorboard
        ("actor/entropy", "policy/entropy", tensorboard_name),
    ],
)
def test_metric_names_map_to_posttrains(engine_name, ours, rename):
    assert rename(engine_name) == ours


@pytest.mark.parametrize("engine", ["TRL", "VERL", "OPENRLHF"])
def test_every_name_the_sdk_maps_to_is_in_the_metric_catalogue(engine):
    unknown = {theirs: ours for theirs, ours in getattr(metric_names, engine).items() if lookup(ours) is None}
    assert not unknown, f"{engine}'s names mapped to metrics the catalogue does not describe: {unknown}"
