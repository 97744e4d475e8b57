"""The engine on one GPU, end to end, without Ray or vLLM: GRPO steps of the engine's own colocated loop
(`rl_engine.loop.train`, every role in this process) on a Qwen2-0.5B-architecture policy (random init, the
demo task's prompts and tokenizer), with the transformers rollout on CUDA and, in turn, the torch trainer,
DeepSpeed ZeRO-2 and DeepSpeed ZeRO-3. Prints one JSON document: per trainer the step time by phase, train
tokens/s, MFU (against the device's datasheet peak and against the bf16 matmul rate measured here), rollout
tokens/s, peak GPU memory and the rollout-vs-trainer log-prob gap; plus the host, the measured peak and the
DeepSpeed op build.

    python3 bench/gpu_check.py                                 # on the GPU host (bench/README.md: wheels, command)
    .venv/bin/python bench/gpu_check.py --device cpu --tiny    # a dry run of every code path, on a CPU

Each step generates `--prompts` x `--samples` responses of exactly `--new-tokens` tokens (a random policy
never samples its eos), trains on them in micro-batches of `--micro-batch`, with a small KL to a reference
model on the GPU too. Step figures are medians over the steps after the first (which pays warm-ups). Exit
status 1 when a trainer failed (its entry then holds the error) or a figure misses the issue's goals
(`--no-goals` reports only): MFU >= 40% of the measured bf16 peak for the torch trainer and a log-prob gap
<= 1e-2. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "sdk")]  # the engine, and the event log it writes through
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

# Qwen2-0.5B's architecture (its config.json); --tiny keeps the vocabulary, so the same paths run.
QWEN2_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
)
TINY = dict(QWEN2_05B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
TRAINERS = {
    "torch": {"training": "torch"},
    "deepspeed_zero2": {"training": "deepspeed", "zero_stage": 2},
    "deepspeed_zero3": {"training": "deepspeed", "zero_stage": 3},
}
PHASES = ("generate", "reward", "forward_reference", "forward_policy", "train", "weight_sync", "step")
GOAL_MFU = 0.40
GOAL_LOGPROB_GAP = 1e-2


def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def host_facts(device: torch.device) -> dict[str, Any]:
    import transformers

    facts: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update(
            gpu=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1), sms=props.multi_processor_count
        )
    return facts


def measured_bf16_tflops(device: torch.device, size: int = 8192, repeats: int = 10) -> float | None:
    """The bf16 matmul rate of this GPU on random data (the MFU goal's denominator); None on the CPU."""
    if device.type != "cuda":
        return None
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        a @ b
    end.record()
    torch.cuda.synchronize(device)
    seconds = start.elapsed_time(end) / 1000 / repeats
    del a, b
    torch.cuda.empty_cache()
    return 2 * size**3 / seconds / 1e12


def build_ops() -> dict[str, Any]:
    """DeepSpeed's set-up step (on CUDA with nvcc: its fused Adam), timed; what the trainers will use."""
    started = time.perf_counter()
    try:
        from rl_engine.backends.deepspeed_trainer import build_ops as build
        from rl_engine.backends.deepspeed_trainer import fused_adam_ready

        built = build()
        return {"seconds": round(time.perf_counter() - started, 1), "ops": built, "fused_adam": fused_adam_ready()}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def build_task(folder: Path, architecture: dict[str, Any], device: torch.device) -> None:
    """The demo task's prompts and tokenizer, and a randomly initialised Qwen2 policy of `architecture`
    saved in bf16 as a Hugging Face folder (the engine loads it as it loads any model)."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from rl_engine.demo import task
    from rl_engine.demo.tokenizer import train_tokenizer

    pairs = task.split_pairs(0, 5000, 1000, 100)
    task.write_jsonl(folder / "data" / "train.jsonl", [task.to_row(p) for p in pairs.train])
    tokenizer = train_tokenizer([r["prompt"] + r["label"] for r in map(task.to_row, task.all_pairs())])
    ids = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    config = Qwen2Config(**architecture, **ids)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(**ids)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    parameters = sum(p.numel() for p in model.parameters())
    log(f"policy: Qwen2ForCausalLM, {parameters:,} parameters, vocabulary {config.vocab_size}")
    del model


def run_config(folder: Path, args: argparse.Namespace, backends: dict[str, Any], steps: int) -> dict[str, Any]:
    return {
        "name": f"gpu-check-{backends['training']}-{backends.get('zero_stage', 0)}",
        "seed": 0,
        "model": {"path": str(folder / "model"), "dtype": args.dtype, "gradient_checkpointing": args.checkpointing},
        "data": {"path": str(folder / "data" / "train.jsonl"), "eval_size": 1},
        "rewards": [{"type": "exact_match"}],
        "algorithm": {"name": "grpo", "kl": {"coef": 0.001, "placement": "loss"}},
        "rollout": {
            "prompts_per_step": args.prompts,
            "samples_per_prompt": args.samples,
            "max_new_tokens": args.new_tokens,
            "temperature": 1.0,
        },
        "train": {"steps": steps, "lr": 1e-6, "micro_batch_size": args.micro_batch},
        "backends": backends,
        "placement": {
            "device": args.device,
            "gpus_per_trainer": 1 if args.device == "cuda" else 0,
            "device_peak_tflops": args.peak_tflops,
        },
        "checkpoint": {"every_steps": 0, "save_final": False},
        "logging": {"eval_every": 0, "samples": "none", "heartbeat_s": 60},
    }


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarise(steps: list[dict[str, float]], measured_tflops: float | None, datasheet_tflops: float | None) -> dict:
    """Medians over the steps after the first; maxima for peaks and gaps."""
    measured = steps[1:] or steps

    def med(name: str) -> float | None:
        return median([s[name] for s in measured if name in s])

    def top(name: str) -> float | None:
        values = [s[name] for s in steps if name in s]
        return max(values) if values else None

    mfu = med("throughput/train_mfu")
    return {
        "steps_measured": len(measured),
        "step_time_s": {phase: med(f"timing/{phase}") for phase in PHASES if med(f"timing/{phase}") is not None},
        "train_tokens_per_s": med("throughput/train_tokens_per_s"),
        "train_mfu": mfu,
        "train_mfu_vs_measured_peak": (
            mfu * datasheet_tflops / measured_tflops if mfu and datasheet_tflops and measured_tflops else None
        ),
        "rollout_tokens_per_s": med("throughput/tokens_per_s"),
        "peak_gpu_memory_gb": top("memory/driver_gpu_peak_gb"),
        "peak_rss_gb": top("memory/driver_peak_gb"),
        "rollout_logprob_diff_max": top("rollout/logprob_diff_max"),
        "rollout_logprob_diff_mean": med("rollout/logprob_diff_mean"),
        "response_length_mean": med("response/length_mean"),
        "policy_loss_finite": all(s.get("policy/loss", 0.0) == s.get("policy/loss", 0.0) for s in steps),
    }


def run_trainer(name: str, folder: Path, args: argparse.Namespace, steps: int) -> list[dict[str, float]]:
    """One run of the engine's loop; each step's metrics, read back from the run's events."""
    from posttrain_sdk.event_log import read_events
    from rl_engine.config import validate_config
    from rl_engine.loop import train

    cfg = validate_config(run_config(folder, args, TRAINERS[name], steps))
    run_dir = folder / "runs" / name
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()  # each run's peak GPU memory is its own
    train(cfg, run_dir)
    return [
        e["data"] for e in read_events(run_dir / "events.jsonl") if e["type"] == "metrics" and (e.get("step") or 0) >= 1
    ]


def datasheet_tflops(device: torch.device, dtype: str, override: float | None) -> float | None:
    from rl_engine.devices import peak_flops

    peak = peak_flops(device, getattr(torch, dtype), override)
    return peak / 1e12 if peak else None


def goals(results: dict[str, Any]) -> list[str]:
    missed = []
    torch_run = results.get("torch", {})
    mfu = torch_run.get("train_mfu_vs_measured_peak")
    if mfu is None or mfu < GOAL_MFU:
        missed.append(f"torch trainer MFU vs the measured bf16 peak {mfu} < {GOAL_MFU}")
    for name, result in results.items():
        gap = result.get("rollout_logprob_diff_max")
        if gap is None or gap > GOAL_LOGPROB_GAP:
            missed.append(f"{name}: rollout-vs-trainer log-prob gap {gap} > {GOAL_LOGPROB_GAP}")
    return missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer policy and a small batch (dry run)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--steps", type=int, default=3, help="RL steps per trainer (the first is not measured)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    parser.add_argument("--trainers", nargs="+", choices=list(TRAINERS), default=list(TRAINERS))
    parser.add_argument("--peak-tflops", type=float, default=None, help="override the datasheet peak for MFU")
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--no-goals", action="store_true", help="exit 0 whatever the figures")
    parser.add_argument("--budget-s", type=float, default=420, help="start no trainer after this many seconds")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    if args.tiny:
        args.prompts, args.samples, args.new_tokens, args.micro_batch = 4, 4, 8, 8
        args.steps = min(args.steps, 2)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device visible (torch.cuda.is_available() is False)"}))
        return 1

    started = time.perf_counter()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    report: dict[str, Any] = {"host": host_facts(device), "settings": {k: str(v) for k, v in vars(args).items()}}
    log(f"host: {report['host']}")
    report["measured_bf16_tflops"] = measured_bf16_tflops(device)
    report["datasheet_tflops"] = datasheet_tflops(device, args.dtype, args.peak_tflops)
    log(f"bf16 matmul: {report['measured_bf16_tflops']} TFLOP/s measured, datasheet {report['datasheet_tflops']}")
    if any(name.startswith("deepspeed") for name in args.trainers):
        report["deepspeed_ops"] = build_ops()
        log(f"DeepSpeed ops: {report['deepspeed_ops']}")

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        folder = args.work_dir or Path(tmp)
        task_started = time.perf_counter()
        build_task(folder, TINY if args.tiny else QWEN2_05B, device)
        report["task_build_s"] = round(time.perf_counter() - task_started, 1)
        for name in args.trainers:
            if time.perf_counter() - started > args.budget_s:
                results[name] = {"error": f"not run: {args.budget_s:g} s budget spent"}
                continue
            log(f"{name}: {args.steps} GRPO steps of {args.prompts} x {args.samples} x {args.new_tokens} tokens")
            run_started = time.perf_counter()
            try:
                steps = run_trainer(name, folder, args, args.steps)
                results[name] = summarise(steps, report["measured_bf16_tflops"], report["datasheet_tflops"])
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            results[name]["wall_s"] = round(time.perf_counter() - run_started, 1)
            log(f"{name}: {json.dumps(results[name])}")
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    report["trainers"] = results
    report["missed_goals"] = goals(results) if device.type == "cuda" else []
    report["total_s"] = round(time.perf_counter() - started, 1)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    failed = any("error" in r for r in results.values())
    return 1 if failed or (report["missed_goals"] and not args.no_goals) else 0


if __name__ == "__main__":
    sys.exit(main())
