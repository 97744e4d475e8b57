"""The engine on a CUDA GPU: every role's models on the GPU, bf16 (fp32 masters, autocast) against fp32,
ZeRO-3's gathers, no host reads inside an update, and the GPU metrics of a run."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from posttrain_sdk.event_log import read_events
from rl_engine.config import validate_config
from rl_engine.loop import build_engine, train
from rl_engine.trainer import Experience, TokenBatch
from tests.gpu.helpers import gpu_config


def on_cuda(module: torch.nn.Module) -> bool:
    return all(p.is_cuda for p in module.parameters())


def fixed_batch(engine) -> tuple[TokenBatch, torch.Tensor]:
    prompts = [p.token_ids for p in engine.data.train[:8]]
    responses = [[5 + (i % 7), 6, 7 + (i % 3)] for i in range(8)]
    return TokenBatch.build(prompts, responses, engine.rollout.pad_id), torch.linspace(-1, 1, 8)


def test_every_role_of_the_hybrid_engine_is_on_the_gpu(tiny_demo, tmp_path):
    engine = build_engine(validate_config(gpu_config(tiny_demo)))
    try:
        trainer = engine.trainer
        assert on_cuda(trainer.model) and on_cuda(trainer.ref_model) and on_cuda(trainer.critic)
        assert engine.rollout.device.type == "cuda"
        batch, _ = fixed_batch(engine)
        assert trainer.forward(batch, "policy").device.type == "cpu"  # results come back to the loop's side
    finally:
        engine.close()


def test_a_lora_policy_trains_its_adapters_on_the_gpu(tiny_demo):
    lora = {"enabled": True, "rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    engine = build_engine(validate_config(gpu_config(tiny_demo, model={"lora": lora})))
    try:
        adapters = [p for n, p in engine.trainer.model.named_parameters() if ".lora_" in n]
        assert adapters and all(p.is_cuda and p.requires_grad for p in adapters)
    finally:
        engine.close()


def test_a_reward_model_scores_on_the_role_gpu(tiny_demo, tmp_path):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from rl_engine.components import build_reward_or_none
    from rl_engine.rewards import RewardBatch

    folder = tmp_path / "rm"
    torch.manual_seed(0)
    classifier = LlamaConfig(
        vocab_size=262,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=0,
    )
    LlamaForSequenceClassification(classifier).save_pretrained(folder)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(tiny_demo / "model").save_pretrained(folder)
    cfg = validate_config(gpu_config(tiny_demo, rewards=[{"type": "reward_model", "path": str(folder)}]))
    reward = build_reward_or_none(cfg, torch.device("cuda", torch.cuda.current_device()))
    result = reward.score(RewardBatch.build(["1+2="], ["3"]))
    component = reward.components[0][0]
    assert component._device.type == "cuda" and on_cuda(component._model)
    assert len(result.total) == 1 and not result.errors[0]


def one_update(demo: Path, dtype: str, backends: dict | None = None) -> tuple[dict, dict, dict, object]:
    """The policy's weights before and after one update on a fixed batch, its metrics, and the trainer."""
    cfg = validate_config(gpu_config(demo, model={"dtype": dtype}, algorithm={"name": "grpo"}, backends=backends or {}))
    engine = build_engine(cfg)
    try:
        batch, scores = fixed_batch(engine)
        advantages = scores[:, None] * batch.response_mask
        before = {k: v.detach().float().cpu() for k, v in engine.trainer.full_state_dict().items()}
        metrics = engine.trainer.update(Experience(batch, advantages, None, None))
        after = {k: v.detach().float().cpu() for k, v in engine.trainer.full_state_dict().items()}
        return before, after, metrics, engine.trainer
    finally:
        engine.close()


def test_a_bf16_update_keeps_fp32_masters_and_moves_the_weights_as_fp32_does(tiny_demo):
    before, fp32, fp32_metrics, _ = one_update(tiny_demo, "float32")
    _, bf16, bf16_metrics, trainer = one_update(tiny_demo, "bfloat16")
    assert trainer.precision.mixed and all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert bf16_metrics["policy/loss"] == pytest.approx(fp32_metrics["policy/loss"], rel=0.05, abs=1e-3)
    assert bf16_metrics["policy/grad_norm"] == pytest.approx(fp32_metrics["policy/grad_norm"], rel=0.05)
    # One AdamW step moves each weight by about lr along the gradient's sign: bf16 compute changes only the
    # signs of the smallest gradients, so the two updates point the same way.
    delta_fp32 = torch.cat([(fp32[k] - before[k]).flatten() for k in before])
    delta_bf16 = torch.cat([(bf16[k] - before[k]).flatten() for k in before])
    assert torch.nn.functional.cosine_similarity(delta_fp32, delta_bf16, dim=0) > 0.95


def test_zero3_gathers_the_same_weights_as_zero0_on_cuda(tiny_demo):
    _, zero0, _, _ = one_update(tiny_demo, "float32", {"training": "deepspeed", "zero_stage": 0})
    _, zero3, _, _ = one_update(tiny_demo, "float32", {"training": "deepspeed", "zero_stage": 3})
    assert zero0.keys() == zero3.keys()
    assert max(float((zero0[k] - zero3[k]).abs().max()) for k in zero0) < 5e-5


def test_an_update_waits_for_the_gpu_only_to_read_its_statistics_back(tiny_demo):
    engine = build_engine(validate_config(gpu_config(tiny_demo, algorithm={"name": "grpo"})))
    try:
        batch, scores = fixed_batch(engine)
        exp = Experience(batch, scores[:, None] * batch.response_mask, None, None)
        engine.trainer.update(exp)  # warm-up: the optimizer's state is created
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                engine.trainer.update(exp)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        # The engine's own: transformers' mask code asks whether a batch is padded, once per forward.
        syncs = [w for w in caught if "synchroniz" in str(w.message).lower() and "rl_engine" in w.filename]
        assert len(syncs) <= 1, [(w.filename, w.lineno) for w in syncs]  # the one read of the statistics
    finally:
        engine.close()


def test_a_run_on_the_gpu_logs_gpu_memory_and_mfu(tiny_demo, tmp_path):
    cfg = validate_config(gpu_config(tiny_demo, placement={"device_peak_tflops": 100.0}))
    train(cfg, tmp_path)
    steps = [e["data"] for e in read_events(tmp_path / "events.jsonl") if e["type"] == "metrics"]
    assert steps and all(m["memory/driver_gpu_peak_gb"] > 0 for m in steps)
    assert all(0 < m["throughput/train_mfu"] < 1 for m in steps)
    assert all(m["rollout/logprob_diff_max"] < 1e-2 for m in steps)
