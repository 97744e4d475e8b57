"""vLLM built for CUDA, colocated with the trainer in one process: sleep mode gives the GPU's memory back
and takes it again, and after every CUDA-IPC weight sync vLLM's log-probs stay within 1e-2 of the trainer's
in bf16. Skipped where vllm is missing or is the CPU build."""

from __future__ import annotations

import pytest
import torch

from posttrain_sdk.event_log import read_events
from rl_engine.config import validate_config
from rl_engine.loop import build_engine, train
from tests.gpu.helpers import gpu_config

pytest.importorskip("vllm")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible", allow_module_level=True)
from vllm.platforms import current_platform

if not current_platform.is_cuda():
    pytest.skip("vllm here is not built for CUDA", allow_module_level=True)


def vllm_config(demo, **sections):
    # The demo size: vLLM's attention needs a head size of at least 32 (the tiny size has 16).
    return gpu_config(
        demo,
        model={"dtype": "bfloat16"},
        algorithm={"name": "grpo"},
        backends={"rollout": "vllm", "vllm_kv_cache_gb": 0.5},
        **sections,
    )


@pytest.fixture(scope="module")
def demo_size(tmp_path_factory):
    from rl_engine.demo.build import build_demo

    out = tmp_path_factory.mktemp("demo-size")
    build_demo(out, seed=0, model_size="demo", sft_steps=20, progress=False)
    return out


def test_sleep_gives_the_gpu_memory_back_and_wake_takes_it_again(demo_size):
    engine = build_engine(validate_config(vllm_config(demo_size)))
    try:
        rollout = engine.rollout
        prompts = [p.token_ids for p in engine.data.train[:4]]
        from rl_engine.rollout import SamplingParams

        rollout.generate(prompts, SamplingParams(n=2, max_new_tokens=4))
        free_awake = torch.cuda.mem_get_info()[0]
        rollout.sleep()
        free_asleep = torch.cuda.mem_get_info()[0]
        assert free_asleep - free_awake > 0.4 * 2**30  # at least most of the 0.5 GiB KV cache
        assert len(rollout.generate(prompts, SamplingParams(n=2, max_new_tokens=4))) == 8  # woken by generate
    finally:
        engine.close()


def test_after_every_ipc_sync_vllm_samples_within_1e_2_of_the_trainer_in_bf16(demo_size, tmp_path):
    train(validate_config(vllm_config(demo_size, train={"steps": 3})), tmp_path)
    steps = [e["data"] for e in read_events(tmp_path / "events.jsonl") if e["type"] == "metrics"]
    assert len(steps) == 3
    assert all(m["rollout/logprob_diff_max"] <= 1e-2 for m in steps), [m["rollout/logprob_diff_max"] for m in steps]
    assert all("memory/rollout_0_gpu_peak_gb" in m for m in steps)
