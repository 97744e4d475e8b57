"""The DeepSpeed training backend against `TorchTrainer`: the same steps on the same batches give the
same weights at every ZeRO stage (so ZeRO-3's gathered weights are the real ones), a run trains and
checkpoints through the loop, and a resumed run continues exactly. Real DeepSpeed, one process (gloo)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain_sdk.event_log import read_events
from rl_engine.config import RunConfig, validate_config
from rl_engine.loop import build_engine, train
from rl_engine.trainer import Experience, TokenBatch
from tests.unit.engine.helpers import rollouts_by_step, stop_at_first_checkpoint

pytestmark = pytest.mark.slow

# fp32 weights after four optimizer steps (lr 3e-3: they move by ~1e-2) differ from TorchTrainer's
# only by summation order in DeepSpeed's flattened gradients and norms; measured max 1.5e-5.
TOLERANCE = 5e-5


@pytest.fixture(scope="module", autouse=True)
def deepspeed_ops() -> None:
    """The set-up step (`make install` runs it): compiles DeepSpeed's JIT op once per environment."""
    from rl_engine.backends.deepspeed_trainer import build_ops

    build_ops()


def config(demo: Path, training: str = "deepspeed", stage: int = 0, offload: bool = False, **sections) -> RunConfig:
    cfg = {
        "name": "ds",
        "seed": 3,
        "model": {"path": str(demo / "model")},
        "data": {
            "path": str(demo / "data" / "train.jsonl"),
            "eval_path": str(demo / "data" / "test.jsonl"),
            "eval_size": 8,
        },
        "rewards": [
            {"type": "exact_match"},
            {"type": "regex", "name": "two_digits", "pattern": r"^\d\d", "weight": 0.5},
        ],
        # PPO with the KL as a loss term: the critic and the reference model take part in every update.
        "algorithm": {"name": "ppo", "kl": {"coef": 0.05, "placement": "loss", "estimator": "k3"}},
        "rollout": {"prompts_per_step": 4, "samples_per_prompt": 2, "max_new_tokens": 4},
        # Two mini-batches of two micro-batches: accumulation and several optimizer steps per RL step;
        # warm-up and cosine: the schedule moves; a low clip: clipping acts.
        "train": {
            "steps": 2,
            "lr": 3e-3,
            "warmup_steps": 1,
            "lr_schedule": "cosine",
            "mini_batch_size": 4,
            "micro_batch_size": 2,
            "grad_clip": 0.5,
        },
        "backends": {"training": training, "zero_stage": stage, "offload": offload},
        "logging": {"eval_every": 0, "heartbeat_s": 60},
    }
    for section, values in sections.items():
        cfg[section] = {**cfg.get(section, {}), **values} if isinstance(values, dict) else values
    return validate_config(cfg)


def fixed_batches(engine) -> list[tuple[TokenBatch, torch.Tensor]]:
    """Two RL steps' worth of real prompts with random responses of varied length, and scores."""
    gen = torch.Generator().manual_seed(0)
    batches = []
    for step in range(2):
        prompts = [engine.data.train[4 * step + i].token_ids for i in range(4) for _ in range(2)]
        responses = [
            torch.randint(3, 200, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen).tolist()
            for _ in prompts
        ]
        batches.append((TokenBatch.build(prompts, responses, engine.rollout.pad_id), torch.randn(8, generator=gen)))
    return batches


def two_updates(cfg: RunConfig) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], list[dict], object]:
    """Policy weights, critic weights and metrics after two RL steps' updates on the fixed batches."""
    engine = build_engine(cfg)
    trainer = engine.trainer
    metrics = []
    for batch, scores in fixed_batches(engine):
        mask = batch.response_mask
        ref = trainer.forward(batch, "reference")
        old = trainer.forward(batch, "policy")
        values = trainer.forward(batch, "values")
        advantages = scores[:, None] * mask
        metrics.append(trainer.update(Experience(batch, advantages, old, ref, values, values + advantages)))
    policy = {k: v.detach().clone() for k, v in trainer.full_state_dict().items()}
    critic = {k: v.detach().clone() for k, v in trainer.state_dict()["critic"].items()}
    return policy, critic, metrics, engine


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def torch_result(tiny_demo):
    policy, critic, metrics, _ = two_updates(config(tiny_demo, training="torch"))
    return policy, critic, metrics


@pytest.mark.parametrize(
    "stage, offload",
    [(0, False), (1, False), (2, False), (3, False), (2, True), (3, True)],
    ids=["zero0", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload"],
)
def test_every_zero_stage_trains_the_same_weights_as_the_torch_trainer(tiny_demo, torch_result, stage, offload):
    want_policy, want_critic, want_metrics = torch_result
    policy, critic, metrics, engine = two_updates(config(tiny_demo, stage=stage, offload=offload))

    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tiny_demo / "model").state_dict()
    assert policy.keys() == initial.keys(), "Hugging Face's names, tied lm_head included"
    assert all(policy[k].shape == initial[k].shape for k in initial), "whole weights, not partitions"
    assert max_diff(want_policy, initial) > 100 * TOLERANCE, "the updates moved the weights"
    print(
        f"zero{stage}{' offload' if offload else ''}: max |policy - torch| {max_diff(policy, want_policy):.2e}, "
        f"max |critic - torch| {max_diff(critic, want_critic):.2e}"
    )
    assert max_diff(policy, want_policy) < TOLERANCE
    assert max_diff(critic, want_critic) < TOLERANCE
    for got, want in zip(metrics, want_metrics):
        assert got.keys() == want.keys()
        for name in ("policy/loss", "policy/grad_norm", "critic/loss", "critic/grad_norm", "policy/lr", "kl/mean"):
            assert got[name] == pytest.approx(want[name], rel=1e-4, abs=1e-6), name
    if stage == 3:
        # The gathered weights above are not what the module holds: its matrices are partitioned.
        embed = engine.model.get_input_embeddings().weight
        assert embed.numel() == 0 and embed.ds_numel == initial["model.embed_tokens.weight"].numel()
        with engine.trainer.full_weights():
            assert torch.equal(engine.model.get_input_embeddings().weight, policy["model.embed_tokens.weight"])


def test_bf16_trains_with_fp32_master_weights_at_every_stage(tiny_demo, torch_result):
    want_policy = torch_result[0]
    for stage in (0, 1, 2, 3):
        policy, _, metrics, engine = two_updates(config(tiny_demo, stage=stage, model={"dtype": "bfloat16"}))
        assert all(v.dtype == torch.bfloat16 for v in policy.values())
        # bf16 forward passes: close to fp32 training, within bf16's resolution of these weights.
        assert max_diff({k: v.float() for k, v in policy.items()}, want_policy) < 0.05
        assert all(torch.isfinite(torch.tensor([m["policy/loss"], m["critic/loss"]])).all() for m in metrics)


def test_a_zero3_run_writes_metrics_and_a_checkpoint_plain_transformers_loads(tiny_demo, tmp_path):
    # Groups of four: enough for rewards to differ within a group, so the updates are not all zero.
    cfg = config(
        tiny_demo,
        stage=3,
        algorithm={"name": "grpo", "kl": {"coef": 0.0}},
        rollout={"samples_per_prompt": 4, "filters": {"zero_advantage": False}},  # every step updates
        logging={"eval_every": 2},
        train={"steps": 2, "mini_batch_size": None, "micro_batch_size": 8},
    )
    last = train(cfg, tmp_path / "run")
    events = read_events(tmp_path / "run" / "events.jsonl")

    assert [e["data"]["state"] for e in events if e["type"] == "status"] == ["running", "succeeded"]
    metrics = [e for e in events if e["type"] == "metrics"]
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for name in ("reward/mean", "policy/loss", "policy/grad_norm", "timing/train", "timing/weight_sync"):
        assert name in metrics[1]["data"], name
    assert last["eval/reward/mean"] == metrics[2]["data"]["eval/reward/mean"]
    from transformers import AutoModelForCausalLM

    described = next(e for e in events if e["type"] == "log")["data"]["message"]
    initial_model = AutoModelForCausalLM.from_pretrained(tiny_demo / "model")
    assert f"with {sum(p.numel() for p in initial_model.parameters()):,} parameters" in described

    checkpoint = next(e for e in events if e["type"] == "checkpoint")["data"]["path"]
    reloaded = AutoModelForCausalLM.from_pretrained(checkpoint)  # no DeepSpeed config active: a plain model
    initial = initial_model.state_dict()
    saved = reloaded.state_dict()
    assert saved.keys() == initial.keys() and all(saved[k].shape == initial[k].shape for k in initial)
    assert any(not torch.equal(saved[k], initial[k]) for k in initial), "training changed the weights"
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr(), "still tied"


@pytest.mark.parametrize(
    "stage, dtype", [(0, "float32"), (3, "float32"), (2, "bfloat16")], ids=["zero0", "zero3", "zero2-bf16"]
)
def test_a_run_stopped_at_step_k_and_resumed_continues_the_same_curve(tiny_demo, tmp_path, stage, dtype):
    # "Contains a digit" varies within groups of four from the first step: every step updates, so the
    # optimizer state (and in bf16 the fp32 master weights) at the checkpoint differ from a fresh start.
    cfg = config(
        tiny_demo,
        stage=stage,
        model={"dtype": dtype},
        train={"steps": 4},
        rollout={"samples_per_prompt": 4},
        rewards=[{"type": "regex", "name": "digit", "pattern": r"\d"}],
        checkpoint={"every_steps": 2, "keep_last": 5},
    )
    train(cfg, tmp_path / "straight")
    straight_events = read_events(tmp_path / "straight" / "events.jsonl")
    assert all(e["data"]["policy/grad_norm"] > 0 for e in straight_events if e["type"] == "metrics" and e["step"] > 0)

    stopped = tmp_path / "stopped"
    stop_at_first_checkpoint(tmp_path / "straight", stopped, step=2)

    train(cfg, stopped, resume=stopped / "checkpoints" / "step_2")
    resumed_events = read_events(stopped / "events.jsonl")

    def curve(events: list[dict]) -> dict[int, dict]:
        return {
            e["step"]: {
                k: v
                for k, v in e["data"].items()
                if not k.startswith(("timing/", "throughput/", "memory/")) and k != "progress/train_time_s"
            }
            for e in events
            if e["type"] == "metrics"
        }

    for step in (3, 4):
        assert curve(resumed_events)[step] == curve(straight_events)[step], f"step {step} differs after resume"
    straight_rollouts, resumed_rollouts = rollouts_by_step(tmp_path / "straight"), rollouts_by_step(stopped)
    for step in (3, 4):
        assert resumed_rollouts[step] == straight_rollouts[step], f"step {step}'s rollouts differ after resume"


def test_a_checkpoint_from_another_backend_setting_is_refused_on_resume(tiny_demo, tmp_path):
    train(config(tiny_demo, stage=1), tmp_path / "run")
    checkpoint = tmp_path / "run" / "checkpoints" / "step_2"
    with pytest.raises(ValueError, match="zero_stage=1.*zero_stage=3"):
        train(config(tiny_demo, stage=3), tmp_path / "resumed", resume=checkpoint)


def test_a_run_whose_deepspeed_op_is_not_built_stops_naming_the_set_up_step(tiny_demo, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "no-ops-here"))
    with pytest.raises(RuntimeError, match="deepspeed_shm_comm.*rl_engine.backends.deepspeed_trainer build-ops"):
        build_engine(config(tiny_demo, stage=0))
    assert not (tmp_path / "no-ops-here").exists(), "nothing was compiled"
