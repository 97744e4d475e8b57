"""vLLM rollout backend against transformers `generate`, on the demo task's policy: generation tokens/s,
weight-sync seconds, and the largest |log-prob(vLLM) - log-prob(trainer)| on sampled tokens before and
right after a sync (the policy perturbed in between, as an update would).

What is timed (median of `--repeats`, after one warm-up): `generate` of `--prompts` prompts x `--n`
samples x up to `--max-new-tokens` tokens at temperature 1 with each backend (tokens/s counts the
tokens actually generated), and `sync_weights` of the whole policy (state dict -> /dev/shm safetensors
-> the engine's in-place reload -> prefix-cache reset).

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python bench/vllm_rollout.py [--size demo|medium]
        [--dtype float32|bfloat16] [--compile] [--prompts 64] [--n 8] [--max-new-tokens 16] [--repeats 3]
        [--train-steps N]

`--train-steps N` also trains the demo run config (32 prompts x 8 samples, 6 new tokens a step) N steps
with each backend and reports the median step, generation and weight-sync seconds, the sync's share of
the step (the issue's target: at most 5%), and the largest `rollout/logprob_diff_max` the run logged.

Prints one JSON document on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

import torch

from bench import _servers
from bench._machine import MachineLoad


def log(message: str) -> None:
    print(f"[bench vllm] {message}", file=sys.stderr, flush=True)


def logprob_gap(model: torch.nn.Module, prompts: list[list[int]], samples, pad_id: int, temperature: float) -> float:
    """Largest |vLLM log-prob - trainer log-prob| over every sampled token, the trainer's computed the way
    the loop computes old log-probs."""
    from rl_engine.trainer import TokenBatch, response_logits, token_logprobs

    batch = TokenBatch.build([prompts[s.prompt_index] for s in samples], [s.response_ids for s in samples], pad_id)
    with torch.no_grad():
        trainer = token_logprobs(response_logits(model, batch, temperature), batch.sequences[:, batch.prompt_width :])
    worst = 0.0
    for row, sample in enumerate(samples):
        engine = torch.tensor(sample.logprobs)
        worst = max(worst, float((engine - trainer[row, : len(engine)]).abs().max()))
    return worst


def train_steps(work: Path, backend: str, steps: int, dtype: str) -> dict[str, float]:
    """The demo run config (32 prompts x 8 samples a step) for `steps` steps; medians over the steps after
    the first (which pays vLLM's first-request warm-up)."""
    from posttrain_sdk.event_log import read_events
    from rl_engine.demo.run_config import demo_run_config
    from rl_engine.loop import train

    log(f"training {steps} steps with the {backend} rollout backend")
    data = work / "data"
    cfg = demo_run_config(
        work,
        model={"path": str(work / "model"), "dtype": dtype},
        data={"path": str(data / "train.jsonl"), "eval_path": str(data / "test.jsonl")},
        train={"steps": steps},
        backends={"rollout": backend},
        checkpoint={"every_steps": 0, "save_final": False},
        logging={"eval_every": 0},
    )
    with tempfile.TemporaryDirectory(prefix=f"bench-run-{backend}-") as run_dir:
        train(cfg, Path(run_dir))
        events = read_events(Path(run_dir) / "events.jsonl")
    steps_data = [e["data"] for e in events if e["type"] == "metrics" and e["step"] > 1]
    median = lambda key: statistics.median(d[key] for d in steps_data)  # noqa: E731
    result = {
        "step_s": median("timing/step"),
        "generate_s": median("timing/generate"),
        "weight_sync_s": median("timing/weight_sync"),
        "weight_sync_share": median("timing/weight_sync") / median("timing/step"),
        "tokens_per_s": median("throughput/tokens_per_s"),
    }
    if backend == "vllm":
        result["logprob_diff_max"] = max(d["rollout/logprob_diff_max"] for d in steps_data)
    return {k: round(v, 7) if k == "logprob_diff_max" else round(v, 4) for k, v in result.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="demo", choices=["demo", "medium"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--compile", action="store_true", help="let vLLM compile the model (slower start)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--train-steps", type=int, default=0, help="also train the demo run config this many steps with each backend"
    )
    args = parser.parse_args()
    # stdout carries the JSON only: everything else (vLLM's and DeepSpeed's loggers print there, from
    # this process and vLLM's children) goes to stderr, at the file-descriptor level.
    json_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    machine = MachineLoad()
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as folder:
        report = run(Path(folder), args)
    report["machine"] = machine.report()
    print(json.dumps(report, indent=2), file=json_out, flush=True)


def run(work: Path, args: argparse.Namespace) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench._models import build_policy
    from rl_engine.backends.vllm_rollout import VLLMRollout
    from rl_engine.devices import DTYPES
    from rl_engine.rollout import SamplingParams, TransformersRollout

    log(f"building the {args.size} demo policy in {work}")
    manifest = build_policy(work, args.size, sft_steps=10)
    path = work / "model"
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[args.dtype])
    rows = [json.loads(line) for line in (work / "data" / "test.jsonl").read_text().splitlines()[: args.prompts]]
    prompts = [tokenizer(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens)

    started = time.perf_counter()
    vllm = VLLMRollout(
        path, tokenizer, dtype=args.dtype, seed=0, max_model_len=128, kv_cache_gb=0.5, enforce_eager=not args.compile
    )
    startup = time.perf_counter() - started
    hf = TransformersRollout(model, tokenizer)

    def tokens_per_s(backend) -> tuple[float, list]:
        backend.generate(prompts, params)  # warm-up
        rates, samples = [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            samples = backend.generate(prompts, params)
            rates.append(sum(len(s.response_ids) for s in samples) / (time.perf_counter() - t))
        return statistics.median(rates), samples

    try:
        log("timing generation")
        vllm_rate, samples = tokens_per_s(vllm)
        hf_rate, _ = tokens_per_s(hf)
        gap_before = logprob_gap(model, prompts, samples, vllm.pad_id, params.temperature)

        log("perturbing the policy and syncing")
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        sync_seconds = [vllm.sync_weights(model) for _ in range(args.repeats)]
        samples = vllm.generate(prompts, params)
        gap_after = logprob_gap(model, prompts, samples, vllm.pad_id, params.temperature)
    finally:
        vllm.close()

    training = None
    if args.train_steps:
        training = {b: train_steps(work, b, args.train_steps, args.dtype) for b in ("vllm", "transformers")}
    return {
        "size": args.size,
        "parameters": manifest["model"]["parameters"],
        "dtype": args.dtype,
        "vllm_compiled": args.compile,
        "prompts": args.prompts,
        "n": args.n,
        "max_new_tokens": args.max_new_tokens,
        "vllm_startup_s": round(startup, 2),
        "tokens_per_s": {
            "vllm": round(vllm_rate),
            "transformers": round(hf_rate),
            "speedup": round(vllm_rate / hf_rate, 2),
        },
        "weight_sync_s_median": round(statistics.median(sync_seconds), 4),
        "logprob_max_abs_diff": {"before_sync": gap_before, "after_sync": gap_after},
        "training": training,
    }


if __name__ == "__main__":
    _servers.run_bench(main)
