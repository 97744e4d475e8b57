"""Where the engine's models run, and what it reports about the device: device resolution and its refusals,
model FLOPs and MFU against hand-computed counts for a Qwen2 config, the GPU memory metric absent (not 0)
on the CPU, and the hot path reading nothing back from the device per micro-batch. All on the CPU; the CUDA
side is in tests/gpu."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from rl_engine import host_dtype
from rl_engine.config import ConfigError, validate_config
from rl_engine.devices import (
    gpu_memory_metrics,
    peak_flops,
    precision_for,
    resolve_device,
    weight_transfer,
    with_host_dtype,
)
from rl_engine.distributed.placement import driver_gpus
from rl_engine.flops import ModelFlops, mfu, model_flops


def config(tmp_path: Path, **placement) -> dict:
    return {
        "name": "devices",
        "model": {"path": str(tmp_path)},
        "data": {"path": str(tmp_path / "train.jsonl")},
        "rewards": [{"type": "exact_match"}],
        "placement": placement,
    }


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# --- the dtype a run leaves to the host ---------------------------------------------------------------------


AVX2_EPYC = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma bmi2\n"
SAPPHIRE_RAPIDS = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON3 = "Features\t: fp asimd sve bf16 i8mm\n"


@pytest.fixture
def host_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(host_dtype.OVERRIDE_ENV, raising=False)


def test_the_cpu_has_bf16_only_with_its_instructions():
    assert not host_dtype.cpu_has_bf16(AVX2_EPYC)
    assert host_dtype.cpu_has_bf16(SAPPHIRE_RAPIDS)
    assert host_dtype.cpu_has_bf16(GRAVITON3)
    assert not host_dtype.cpu_has_bf16("")


def test_auto_is_float32_on_a_cpu_without_bf16_and_bfloat16_on_one_with_it(
    tmp_path, monkeypatch, no_cuda, host_decides
):
    cfg = validate_config(config(tmp_path))
    assert cfg.model.dtype == "auto"
    monkeypatch.setattr(host_dtype, "cpu_has_bf16", lambda cpuinfo=None: False)
    assert with_host_dtype(cfg).model.dtype == "float32"
    monkeypatch.setattr(host_dtype, "cpu_has_bf16", lambda cpuinfo=None: True)
    assert with_host_dtype(cfg).model.dtype == "bfloat16"
    assert cfg.model.dtype == "auto"  # the given config is left as it was


def test_auto_on_gpus_is_bfloat16_unless_the_visible_gpu_lacks_it(tmp_path, monkeypatch, host_decides):
    cfg = validate_config(config(tmp_path, gpus_per_trainer=1))
    monkeypatch.setattr(host_dtype, "cpu_has_bf16", lambda cpuinfo=None: False)
    monkeypatch.setattr(host_dtype, "cuda_has_bf16", lambda: None)  # a driver whose actors hold the GPUs
    assert with_host_dtype(cfg).model.dtype == "bfloat16"
    monkeypatch.setattr(host_dtype, "cuda_has_bf16", lambda: False)  # a V100 or T4
    assert with_host_dtype(cfg).model.dtype == "float32"


def test_the_hosts_admin_fixes_what_auto_becomes(tmp_path, monkeypatch, host_decides):
    monkeypatch.setattr(host_dtype, "cpu_has_bf16", lambda cpuinfo=None: True)
    cfg = validate_config(config(tmp_path))
    monkeypatch.setenv(host_dtype.OVERRIDE_ENV, "float32")
    assert with_host_dtype(cfg).model.dtype == "float32"
    monkeypatch.setenv(host_dtype.OVERRIDE_ENV, "fp8")
    with pytest.raises(ValueError, match="POSTTRAIN_AUTO_DTYPE='fp8': must be one of float32, bfloat16, float16"):
        with_host_dtype(cfg)


def test_a_named_dtype_is_kept_whatever_the_host(tmp_path, monkeypatch):
    monkeypatch.setattr(host_dtype, "cpu_has_bf16", lambda cpuinfo=None: True)
    cfg = validate_config({**config(tmp_path), "model": {"path": str(tmp_path), "dtype": "float32"}})
    assert with_host_dtype(cfg) is cfg


# --- resolution ------------------------------------------------------------------------------------


def test_auto_runs_a_role_without_a_reserved_gpu_on_the_cpu(tmp_path):
    cfg = validate_config(config(tmp_path))
    assert resolve_device(cfg, driver_gpus(cfg)) == torch.device("cpu")


def test_cpu_is_honoured_even_where_placement_reserves_a_gpu(tmp_path, no_cuda):
    cfg = validate_config(config(tmp_path, device="cpu", gpus_per_trainer=1))
    assert resolve_device(cfg, driver_gpus(cfg)) == torch.device("cpu")


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_cuda_wanted_where_none_is_visible_is_refused_naming_the_field(tmp_path, no_cuda, device):
    cfg = validate_config(config(tmp_path, device=device, gpus_per_trainer=1))
    with pytest.raises(ConfigError) as refused:
        resolve_device(cfg, driver_gpus(cfg), "hybrid engine")
    assert refused.value.errors[0]["loc"] == "placement.device"
    assert "hybrid engine" in refused.value.errors[0]["msg"] and "device: cpu" in refused.value.errors[0]["msg"]


@pytest.mark.parametrize(
    "placement, loc",
    [
        ({"device": "cuda"}, "placement.gpus_per_trainer"),
        ({"device": "cuda", "mode": "separate", "gpus_per_rollout_engine": 1}, "placement.gpus_per_trainer"),
        ({"device": "cuda", "mode": "separate", "gpus_per_trainer": 1}, "placement.gpus_per_rollout_engine"),
    ],
)
def test_cuda_without_a_reserved_gpu_is_refused_when_the_config_validates(tmp_path, placement, loc):
    with pytest.raises(ConfigError) as refused:
        validate_config(config(tmp_path, **placement))
    assert [e["loc"] for e in refused.value.errors] == [loc]


def test_the_hybrid_engine_asks_ray_for_its_gpus_and_actors_leave_them_to_their_bundles(tmp_path):
    assert driver_gpus(validate_config(config(tmp_path, gpus_per_trainer=0.5, gpus_per_rollout_engine=1))) == 1
    assert driver_gpus(validate_config(config(tmp_path, mode="separate", gpus_per_trainer=1))) == 0


def test_a_run_that_needs_cuda_here_ends_with_the_field_error_before_loading_anything(tiny_demo, tmp_path, capsys):
    from rl_engine.__main__ import main

    cfg = {
        **config(tiny_demo / "model", gpus_per_trainer=1),
        "data": {"path": str(tiny_demo / "data" / "train.jsonl")},
    }
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: the run would start")
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(cfg))
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: placement.device: the hybrid engine")


@pytest.mark.parametrize(
    "placement, device, transfer",
    [
        ({}, "cuda", "ipc"),  # the hybrid engine: trainer and engine share the driver's GPU
        ({"rollout_engines": 2, "trainer_ranks": 2}, "cuda", "ipc"),  # bundle i: rank i and engine i
        ({"rollout_engines": 2}, "cuda", "file"),  # engine 1 has no trainer rank on its GPU
        ({"mode": "separate", "gpus_per_trainer": 1}, "cuda", "nccl"),
        ({"mode": "separate"}, "cuda", "file"),  # a trainer on the CPU
        ({}, "cpu", "file"),
    ],
)
def test_a_weight_sync_goes_gpu_to_gpu_where_trainer_and_engine_both_have_one(tmp_path, placement, device, transfer):
    cfg = validate_config({**config(tmp_path, **placement), "backends": {"rollout": "vllm"}})
    assert weight_transfer(cfg, torch.device(device)) == transfer
    transformers_rollout = validate_config(config(tmp_path, **placement))
    assert weight_transfer(transformers_rollout, torch.device(device)) == "file"


def test_mixed_precision_keeps_fp32_masters_for_the_torch_trainer_on_cuda_and_cpu(tmp_path):
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    bf16 = validate_config({**config(tmp_path), "model": {"path": str(tmp_path), "dtype": "bfloat16"}})
    assert (precision_for(bf16, cuda).master, precision_for(bf16, cuda).compute) == (torch.float32, torch.bfloat16)
    assert (precision_for(bf16, cpu).master, precision_for(bf16, cpu).compute) == (torch.float32, torch.bfloat16)
    fp16 = validate_config({**config(tmp_path), "model": {"path": str(tmp_path), "dtype": "float16"}})
    assert not precision_for(fp16, cpu).mixed  # no loss scaler: pure fp16
    deepspeed = bf16.model_copy(update={"backends": bf16.backends.model_copy(update={"training": "deepspeed"})})
    assert not precision_for(deepspeed, cuda).mixed  # DeepSpeed keeps its own fp32 masters


# --- FLOPs and MFU ---------------------------------------------------------------------------------

# A Qwen2 config small enough to count by hand: hidden 64, MLP 128, 2 layers, 4 query heads of 16, 2 KV heads,
# a 100-token vocabulary with the output head tied to the embedding.
QWEN2 = dict(
    vocab_size=100,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)
# Per layer: q 64x64, k 64x32, v 64x32, o 64x64, gate/up/down 3 x 64x128 = 4096+2048+2048+4096+24576 = 36864.
MATMUL_PARAMS = 2 * 36864 + 100 * 64  # + the (tied) output head: 80128


def qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**QWEN2))


def test_model_flops_count_every_matmul_weight_once_and_no_embedding_lookup():
    assert model_flops(qwen2()) == ModelFlops(MATMUL_PARAMS, MATMUL_PARAMS, layers=2, attention_width=64)


def test_train_flops_are_6n_per_token_plus_three_times_causal_attention():
    counts = model_flops(qwen2())
    # Sequences of 3 and 5 real tokens: 8 tokens; causal pairs 3*4/2 + 5*6/2 = 21, 2 matmuls x 2 FLOPs x 64
    # wide x 2 layers per pair forward, x3 with the backward.
    expected = 6 * MATMUL_PARAMS * 8 + 3 * (2 * 2 * 64 * (3 * 4 + 5 * 6))
    assert counts.train_flops(torch.tensor([3, 5])) == expected == 3878400
    assert mfu(expected, seconds=2.0, peak_flops_per_s=1e6) == pytest.approx(expected / 2e6)


def test_frozen_weights_cost_no_weight_gradients():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(qwen2(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    adapters = 2 * ((64 * 4 + 4 * 64) + (64 * 4 + 4 * 32))  # two layers of q (64->4->64) and v (64->4->32)
    counts = model_flops(model)
    assert counts.matmul_params == MATMUL_PARAMS + adapters and counts.trained_matmul_params == adapters
    assert counts.train_flops(torch.tensor([10])) == (4 * (MATMUL_PARAMS + adapters) + 2 * adapters) * 10 + 3 * (
        2 * 2 * 64 * 10 * 11
    )


def test_peak_flops_come_from_the_config_then_the_datasheet_and_none_on_the_cpu(monkeypatch):
    assert peak_flops(torch.device("cpu"), torch.bfloat16, None) is None
    assert peak_flops(torch.device("cpu"), torch.bfloat16, 2.5) == 2.5e12
    cuda = torch.device("cuda", 0)
    for name, bf16, fp32 in [("NVIDIA H200", 989.4, 66.9), ("NVIDIA H100 PCIe", 756.5, 51.2)]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert peak_flops(cuda, torch.bfloat16, None) == pytest.approx(bf16 * 1e12)
        assert peak_flops(cuda, torch.float32, None) == pytest.approx(fp32 * 1e12)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert peak_flops(cuda, torch.bfloat16, None) is None


# --- what a run on the CPU reports -----------------------------------------------------------------


def tiny_run(demo: Path, **placement) -> dict:
    return {
        "name": "devices-run",
        "seed": 3,
        "model": {"path": str(demo / "model")},
        "data": {"path": str(demo / "data" / "train.jsonl")},
        "rewards": [{"type": "regex", "name": "two_digits", "pattern": r"^\d\d"}],
        "algorithm": {"name": "grpo", "kl": {"coef": 0.01}},
        "rollout": {"prompts_per_step": 4, "samples_per_prompt": 4, "max_new_tokens": 4, "temperature": 0.7},
        "train": {"steps": 2, "lr": 3e-3, "micro_batch_size": 8},
        "placement": placement,
        "checkpoint": {"save_final": False},
        "logging": {"eval_every": 0, "heartbeat_s": 60},
    }


def run_metrics(cfg: dict, run_dir: Path) -> list[dict]:
    from posttrain_sdk.event_log import read_events
    from rl_engine.loop import train

    train(validate_config(cfg), run_dir)
    return [e["data"] for e in read_events(run_dir / "events.jsonl") if e["type"] == "metrics"]


@pytest.mark.slow
def test_on_the_cpu_gpu_memory_is_absent_and_device_cpu_runs_the_same_steps(tiny_demo, tmp_path):
    auto = run_metrics(tiny_run(tiny_demo), tmp_path / "auto")
    cpu = run_metrics(tiny_run(tiny_demo, device="cpu"), tmp_path / "cpu")
    for steps in (auto, cpu):
        assert all("memory/driver_peak_gb" in m for m in steps)
        assert not [name for m in steps for name in m if "gpu" in name]
        assert not [name for m in steps for name in m if name == "throughput/train_mfu"]  # no peak known

    def same(m: dict) -> dict:
        return {k: v for k, v in m.items() if not k.startswith(("timing/", "throughput/", "memory/", "progress/"))}

    assert [same(m) for m in auto] == [same(m) for m in cpu]
    # The transformers rollout reports each token's log-prob under the distribution it sampled from (its
    # KV-cached decoding at temperature 0.7); the training forward agrees to fp32 rounding.
    assert all(m["rollout/logprob_diff_max"] < 1e-4 for m in auto)


@pytest.mark.slow
def test_a_configured_peak_gives_the_mfu_of_the_update(tiny_demo, tmp_path):
    steps = run_metrics(tiny_run(tiny_demo, device_peak_tflops=1.0), tmp_path / "run")
    assert all(0 < m["throughput/train_mfu"] < 1 for m in steps)


def test_gpu_memory_of_a_role_on_the_cpu_is_left_out():
    assert gpu_memory_metrics("driver", torch.device("cpu")) == {}
    assert gpu_memory_metrics("driver", None) == {}


def test_an_update_reads_nothing_back_from_the_device_per_micro_batch(tiny_demo, monkeypatch):
    """Host reads of tensors (float(), bool(), .item(), .tolist()) in a micro-batch's forward, loss and backward would
    each wait for the GPU: none happen there, and the update reads its statistics back once. (The optimizer
    step is torch's: on the CPU its step counter is a host tensor it reads; on CUDA the fused AdamW reads
    nothing, which tests/gpu checks with CUDA's sync debug mode. transformers' own mask code reads whether a
    batch is padded; only the engine's reads count.)"""
    from rl_engine.components import load_policy
    from rl_engine.trainer import Experience, TokenBatch, TorchTrainer

    cfg = validate_config(tiny_run(tiny_demo))
    trainer = TorchTrainer(cfg, load_policy(cfg.model.path, cfg), None, None)
    batch = TokenBatch.build([[5, 6, 7]] * 16, [[8, 9, 10, 11]] * 16, pad_id=0)
    exp = Experience(batch, torch.randn(16, 4), None, None, rollout_logprobs=torch.full((16, 4), -1.0))

    reads: list[str] = []
    inside = {"hot": False}
    for method in ("item", "tolist", "__float__", "__bool__", "__int__"):
        original = getattr(torch.Tensor, method)

        def counted(self, *args, _original=original, _name=method, **kwargs):
            if "rl_engine" in Path(sys._getframe(1).f_code.co_filename).parts:  # ours, not a library's
                reads.append(f"{_name}{'@hot' if inside['hot'] else ''}")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, counted)
    for hook in ("_micro_step",):
        original_hook = getattr(TorchTrainer, hook)

        def flagged(self, *args, _original=original_hook, **kwargs):
            inside["hot"] = True
            try:
                return _original(self, *args, **kwargs)
            finally:
                inside["hot"] = False

        monkeypatch.setattr(TorchTrainer, hook, flagged)
    metrics = trainer.update(exp)
    assert [r for r in reads if r.endswith("@hot")] == []
    assert reads.count("tolist") == 1
    assert {"policy/loss", "policy/grad_norm", "rollout/logprob_diff_max"} <= set(metrics)
