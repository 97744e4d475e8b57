"""End-to-end engine runs at tiny scale: correctness only (rewards, events, checkpoints, resume) —
never speed or learning."""

from __future__ import annotations

import json
import re

import pytest
import torch

from posttrain_sdk.event_log import read_events
from posttrain_sdk.rollout_files import read_table, table_stats
from rl_engine.__main__ import main
from rl_engine.config import dump_config, validate_config
from rl_engine.loop import train
from rl_engine.metric_catalogue import lookup
from rl_engine.spec.checkpoints import list_checkpoints
from tests.unit.engine.helpers import by_type, comparable, step_rows, stop_at_first_checkpoint, tiny_config

pytestmark = pytest.mark.slow


def uncatalogued(metrics: list[dict]) -> list[str]:
    """Metrics logged that rl_engine/metric_catalogue.py does not describe (the run page would not draw them)."""
    return sorted({name for event in metrics for name in event["data"] if lookup(name) is None})


def test_a_grpo_run_writes_status_metrics_every_sample_and_a_loadable_checkpoint(tiny_demo, tmp_path):
    cfg = validate_config(tiny_config(tiny_demo))
    last = train(cfg, tmp_path / "run")
    events = read_events(tmp_path / "run" / "events.jsonl")

    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    states = [e["data"]["state"] for e in by_type(events, "status")]
    assert states == ["running", "succeeded"]
    # The rollout files are written on a thread of their own, yet every step's is announced before the
    # checkpoint after it and before the final status (the platform may stop listening there).
    kinds = [e["type"] for e in events if e["type"] != "heartbeat"]
    assert kinds[-1] == "status" and max(i for i, k in enumerate(kinds) if k == "samples") < kinds.index("checkpoint")
    metrics = by_type(events, "metrics")
    assert [m["step"] for m in metrics] == [0, 1, 2]  # step 0 is the evaluation before training
    assert uncatalogued(metrics) == []
    for name in (
        "reward/mean",
        "reward/exact_match",
        "reward/two_digits",
        "policy/entropy",
        "policy/clip_ratio",
        "response/length_mean",
        "response/truncated_rate",
        "timing/generate",
        "timing/reward",
        "timing/train",
        "timing/weight_sync",
        "throughput/tokens_per_s",
    ):
        assert name in metrics[1]["data"], name
    assert (
        "eval/reward/mean" in metrics[2]["data"] and last["eval/reward/mean"] == metrics[2]["data"]["eval/reward/mean"]
    )

    samples = by_type(events, "samples")
    # One file per step with every sample; the event carries the file's reference and its statistics.
    assert [(s["step"], s["data"]["file"], s["data"]["rows"]) for s in samples] == [
        (1, "step_00000001.parquet", 16),
        (2, "step_00000002.parquet", 16),
    ]
    for event in samples:
        path = tmp_path / "run" / "rollouts" / event["data"]["file"]
        assert event["data"]["bytes"] == path.stat().st_size
        assert event["data"]["stats"] == table_stats(read_table(path))
        assert "samples" not in event["data"]
    for sample in step_rows(tmp_path / "run", samples[0]):
        sample["components"] = json.loads(sample["components"])
        # The rewards recorded are the rewards of the text recorded.
        expected_format = 1.0 if re.match(r"\d\d", sample["response"]) else 0.0
        assert sample["components"]["two_digits"] == expected_format
        answer_ok = sample["response"].strip() == sample["label"]
        assert sample["components"]["exact_match"] == (1.0 if answer_ok else 0.0)
        assert sample["reward"] == pytest.approx(sample["components"]["exact_match"] + 0.5 * expected_format)
        assert sample["finish_reason"] in ("stop", "length")
        # The per-token view: a piece and the rollout's values per token; GRPO's advantage is the
        # sequence's on every token. No old-policy pass ran (one update per batch): no trainer log-probs.
        assert len(sample["token_text"]) == len(sample["token_ids"]) == sample["length"]
        assert sample["trainer_logprob"] is None and sample["prompt_token_ids"]
        assert all(lp <= 0 for lp in sample["rollout_logprob"])
        assert all(h >= 0 for h in sample["entropy"])
        if sample["kept"]:
            assert sample["token_advantage"] == pytest.approx([sample["advantage"]] * sample["length"], abs=1e-6)
        else:  # the zero-advantage filter (on by default for GRPO) kept its tied group out of the update
            assert sample["token_advantage"] is None and sample["advantage"] == 0.0
    # The zero-advantage filter dropped exactly the groups whose samples all scored the same.
    rows = step_rows(tmp_path / "run", samples[0])
    rewards_by_group: dict[int, set[float]] = {}
    for sample in rows:
        rewards_by_group.setdefault(sample["group"], set()).add(sample["reward"])
    tied = {group for group, rewards in rewards_by_group.items() if len(rewards) == 1}
    assert {s["group"] for s in rows if not s["kept"]} == tied
    assert metrics[1]["data"]["filter/zero_advantage/dropped"] == 4 * len(tied)

    checkpoints = by_type(events, "checkpoint")
    assert len(checkpoints) == 1 and checkpoints[0]["step"] == 2
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(checkpoints[0]["data"]["path"])
    initial = AutoModelForCausalLM.from_pretrained(tiny_demo / "model")
    changed = any(not torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), initial.state_dict().values()))
    assert changed, "training did not change the weights"


def test_evaluating_the_final_checkpoint_reproduces_the_runs_last_evaluation(tiny_demo, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(dump_config(validate_config(tiny_config(tiny_demo))))
    assert main(["train", str(config), "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 0
    last = json.loads(capsys.readouterr().out)
    checkpoint = list_checkpoints(tmp_path / "run")[-1]
    assert main(["evaluate", str(config), "--checkpoint", str(checkpoint)]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["eval/reward/mean"] == last["eval/reward/mean"]


@pytest.mark.parametrize(
    "algorithm",
    [
        {"name": "ppo", "kl": {"coef": 0.05, "placement": "reward", "estimator": "k1"}},
        {"name": "reinforce_pp", "kl": {"coef": 0.05, "placement": "reward", "estimator": "k2"}},
        {"name": "reinforce_pp_baseline", "kl": {"coef": 0.05, "placement": "loss", "estimator": "k3"}},
        {"name": "rloo", "dual_clip": 3.0, "clip_high": 0.28},
        {"name": "dr_grpo", "loss_agg": "seq_mean_token_sum_norm", "dynamic_sampling": True},
        {"name": "grpo", "dynamic_sampling": True},
        {"name": "grpo", "entropy_coef": 0.01, "overlong": {"enabled": True, "buffer_tokens": 2}},
        {"name": "grpo", "policy_loss": "gspo"},
        {"name": "dr_grpo", "policy_loss": "cispo", "normalize_advantage_std": True},
        {"name": "rloo", "policy_loss": "gmpo", "normalize_advantage_std": True},
        {"name": "ppo", "policy_loss": "gspo", "rollout_correction": {"method": "sequence_mis"}},
        {"name": "grpo", "policy_loss": "cispo", "rollout_correction": {"method": "icepop"}},
    ],
)
def test_every_algorithm_trains_a_few_steps_with_finite_losses(tiny_demo, tmp_path, algorithm):
    cfg = validate_config(
        tiny_config(
            tiny_demo,
            algorithm=algorithm,
            train={"epochs_per_batch": 2, "mini_batch_size": 8},
            logging={"eval_every": 0},
            checkpoint={"save_final": False},
        )
    )
    train(cfg, tmp_path / "run")
    events = by_type(read_events(tmp_path / "run" / "events.jsonl"), "metrics")
    assert uncatalogued(events) == []
    steps = [e["data"] for e in events]
    trained = [m for m in steps if m["batch/kept_fraction"] > 0]  # dynamic sampling may skip a step
    assert trained, "no step had a learning signal"
    losses = [v for m in trained for k, v in m.items() if k.endswith("/loss")]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    if cfg.algorithm.kl.coef > 0:
        assert all("kl/mean" in m for m in trained)
    if algorithm["name"] == "ppo":
        assert all("critic/loss" in m for m in trained)


ROLLOUT_CORR_METRICS = (
    "rollout_corr/kl",
    "rollout_corr/k3_kl",
    "rollout_corr/log_ppl_abs_diff",
    "rollout_corr/chi2_token",
    "rollout_corr/chi2_seq",
    "rollout_corr/weight_p05",
    "rollout_corr/weight_p50",
    "rollout_corr/weight_p95",
    "rollout_corr/weight_mean",
    "rollout_corr/masked_fraction",
    "rollout_corr/truncated_fraction",
)


def test_a_gspo_run_with_token_tis_logs_the_rollout_mismatch_every_step(tiny_demo, tmp_path):
    """The transformers rollout reports its sampled tokens' log-probs; against the trainer's (same weights,
    fp32) the mismatch is numerical noise, so the weights stay at 1 and nothing is truncated."""
    cfg = validate_config(
        tiny_config(
            tiny_demo,
            algorithm={"name": "grpo", "policy_loss": "gspo", "rollout_correction": {"method": "token_tis"}},
            rollout={"filters": {"zero_advantage": False}},  # every step trains, tied groups or not
            logging={"eval_every": 0},
            checkpoint={"save_final": False},
        )
    )
    train(cfg, tmp_path / "run")
    steps = [e["data"] for e in by_type(read_events(tmp_path / "run" / "events.jsonl"), "metrics")]
    assert len(steps) == 2
    for metrics in steps:
        for name in (*ROLLOUT_CORR_METRICS, "timing/advantages", "timing/correction", "timing/record"):
            assert name in metrics, name
        assert abs(metrics["rollout_corr/kl"]) < 1e-4 and metrics["rollout_corr/chi2_token"] < 1e-3
        assert metrics["rollout_corr/weight_p05"] == pytest.approx(1.0, abs=1e-3)
        assert metrics["rollout_corr/truncated_fraction"] == 0.0
        assert metrics["rollout/logprob_diff_max"] < 1e-4


def test_top_k_sampling_is_a_real_mismatch_that_the_correction_measures_and_weighs(tiny_demo, tmp_path):
    """Top-k samples from the distribution renormalised over the k most likely tokens; the trainer scores
    them under its full softmax, so every sampled token's ratio trainer / rollout is <= 1."""
    cfg = validate_config(
        tiny_config(
            tiny_demo,
            algorithm={"rollout_correction": {"method": "token_tis"}},
            rollout={"top_k": 3, "filters": {"zero_advantage": False}},  # every step trains
            logging={"eval_every": 0},
            checkpoint={"save_final": False},
        )
    )
    train(cfg, tmp_path / "run")
    steps = [e["data"] for e in by_type(read_events(tmp_path / "run" / "events.jsonl"), "metrics")]
    for metrics in steps:
        assert metrics["rollout_corr/kl"] > 0.01  # KL(rollout || trainer) on the rollout's own samples
        assert metrics["rollout_corr/weight_max"] <= 1.0 + 1e-5
        assert metrics["rollout_corr/weight_p50"] < 1.0 and metrics["rollout_corr/weight_mean"] < 1.0


@pytest.mark.parametrize(("method", "old_policy_passes"), [("none", 0), ("metrics", 1)])
def test_only_a_rollout_correction_adds_an_old_policy_forward_to_a_single_update_step(
    tiny_demo, tmp_path, method, old_policy_passes
):
    from rl_engine.loop import build_engine, run_step

    cfg = validate_config(
        tiny_config(tiny_demo, algorithm={"rollout_correction": {"method": method}}, logging={"eval_every": 0})
    )
    engine = build_engine(cfg)
    calls: list[str] = []
    forward = engine.trainer.forward
    engine.trainer.forward = lambda batch, which: calls.append(which) or forward(batch, which)
    try:
        metrics, _ = run_step(engine, 1)
    finally:
        engine.close()
    assert calls.count("policy") == old_policy_passes
    assert ("rollout_corr/kl" in metrics) == (method != "none")
    # Either way the engine's log-probs are checked against the trainer's.
    assert metrics["rollout/logprob_diff_max"] < 1e-4


def test_a_run_stopped_at_step_k_and_resumed_continues_the_same_curve(tiny_demo, tmp_path):
    cfg = validate_config(
        tiny_config(
            tiny_demo,
            train={"steps": 4, "lr_schedule": "cosine", "warmup_steps": 1, "epochs_per_batch": 2, "mini_batch_size": 8},
            checkpoint={"every_steps": 2, "keep_last": 5},
            logging={"eval_every": 2},
        )
    )
    train(cfg, tmp_path / "straight")
    straight = {e["step"]: e["data"] for e in by_type(read_events(tmp_path / "straight" / "events.jsonl"), "metrics")}

    # "Stop" after step 2: a run folder holding only what existed when step 2's checkpoint was written.
    stopped = tmp_path / "stopped"
    stop_at_first_checkpoint(tmp_path / "straight", stopped, step=2)

    train(cfg, stopped, resume=stopped / "checkpoints" / "step_2")
    events = read_events(stopped / "events.jsonl")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), "seq continues after the resume"
    resumed = {e["step"]: e["data"] for e in by_type(events, "metrics")}
    for step in (3, 4):
        assert comparable(resumed[step]) == comparable(straight[step]), f"step {step} differs after resume"
    samples_straight = by_type(read_events(tmp_path / "straight" / "events.jsonl"), "samples")
    samples_resumed = by_type(events, "samples")
    for resumed_event, straight_event in zip(samples_resumed[-2:], samples_straight[-2:], strict=True):
        assert step_rows(stopped, resumed_event) == step_rows(tmp_path / "straight", straight_event)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["train", "/nonexistent/run.yaml"], "no such config file"),
        (["train", "{config}", "--set", "train.lr=-1"], "train.lr"),
        (["train", "{config}", "--set", "algorithm.name=sarsa"], "algorithm.name"),
        (["train", "{config}", "--set", "rollout.samples_per_prompt=1"], "rollout.samples_per_prompt"),
        (["train", "{config}", "--set", "data.path=/nope.jsonl"], "data.path: /nope.jsonl does not exist"),
        (["evaluate", "{config}", "--checkpoint", "/no/checkpoint"], "no such folder"),
        (["train", "{config}", "--resume", "/no/checkpoint"], "no such checkpoint folder"),
    ],
)
def test_bad_input_ends_with_one_clear_line_and_exit_code_2(tiny_demo, tmp_path, capsys, args, expected):
    config = tmp_path / "run.yaml"
    config.write_text(dump_config(validate_config(tiny_config(tiny_demo))))
    extra = ["--no-progress", "--run-dir", str(tmp_path / "run")] if args[0] == "train" else []
    code = main([a.replace("{config}", str(config)) for a in args] + extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("error: ") and expected in err[-1]


def test_the_per_token_view_is_recorded_every_nth_step_with_the_trainers_log_probs(tiny_demo):
    from rl_engine.loop import build_engine, run_step
    from rl_engine.rollout_store import PieceCache, step_table

    cfg = validate_config(
        tiny_config(
            tiny_demo,
            algorithm={"rollout_correction": {"method": "metrics"}},
            # every sample trains, so every one has the trainer's log-probs
            rollout={"filters": {"zero_advantage": False}},
            logging={"token_view_every": 2},
        )
    )
    engine = build_engine(cfg)
    try:
        _, first = run_step(engine, 1)
        _, second = run_step(engine, 2)
        pieces = PieceCache(engine.tokenizer)
        first_rows, second_rows = (step_table(r, pieces).to_pylist() for r in (first, second))
    finally:
        engine.close()
    assert all(row["token_ids"] is None and row["token_text"] is None for row in first_rows)
    for row in second_rows:
        # Same weights, fp32: the trainer's log-probs are the rollout's.
        assert len(row["rollout_logprob"]) == len(row["trainer_logprob"]) == row["length"]
        assert row["trainer_logprob"] == pytest.approx(row["rollout_logprob"], abs=1e-4)
        assert len(row["token_text"]) == len(row["token_ids"]) == row["length"]
