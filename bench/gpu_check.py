"""The engine on one GPU, end to end, without Ray or vLLM: GRPO steps of the engine's own colocated loop
(`rl_engine.loop.train`, every role in one process) on a Qwen2-0.5B-architecture policy (random init, the demo
task's prompts and tokenizer), with the transformers rollout on CUDA and, in turn, the torch trainer, DeepSpeed
ZeRO-2 and DeepSpeed ZeRO-3. Prints one JSON document (and writes it to --out, by default $OUT/gpu_check.json
where $OUT is set): per trainer the step time by phase, train tokens/s, MFU (against the device's datasheet peak
and against the bf16 matmul rate measured here), rollout tokens/s, peak GPU memory and the rollout-vs-trainer
log-prob gap; plus the host, the measured peak, the DeepSpeed op build and the machine's load.

    bash bench/gpu_device_run.sh run                          # on the GPU host: wheels, environment, log, timeout
    python3 bench/gpu_check.py                                # the same check without the wrapper
    .venv/bin/python bench/gpu_check.py --device cpu --tiny   # a dry run of every code path, on a CPU

Each step generates `--prompts` x `--samples` responses of exactly `--new-tokens` tokens (a random policy never
samples its eos), trains on them in micro-batches of `--micro-batch`, with a small KL to a reference model on the
GPU too. Step figures are medians over the steps after the first (which pays warm-ups). Each trainer runs in a
process of its own: its peak GPU memory is its own (nothing an earlier trainer left counts), and one that hangs
(NCCL, say) is killed at the budget while the others keep their figures.

Bounded: the whole run gets `--budget-s` (300 s): a trainer starts only while the time left is at least the
longest one so far, each is killed at the deadline, and past it the document is written with what was measured
and the run exits 3. The document is rewritten after every phase, so a run killed from outside leaves its
figures. On CUDA the DeepSpeed fused Adam is built for the device's architecture (TORCH_CUDA_ARCH_LIST, MAX_JOBS,
TORCH_EXTENSIONS_DIR under /tmp) and used only if it loads; NCCL talks over the loopback interface and DeepSpeed's
process group times out after DEEPSPEED_TIMEOUT minutes (2), not its default 10. Each is a default the
environment can override.

Exit status: 0 when every trainer ran; 1 when a trainer failed (its entry holds the error and the end of its
stderr); 3 when the budget ran out. The issue's goals (MFU >= 40% of the measured bf16 peak for the torch trainer,
log-prob gap <= 1e-2) are reported in `missed_goals`; `--enforce-goals` makes a missed one exit 1 too.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "sdk")]  # the engine, the event log it writes through, the bench helpers
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from bench import _servers  # noqa: E402
from bench._machine import MachineLoad  # noqa: E402

# Qwen2-0.5B's architecture (its config.json).
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


def shrunk(architecture: dict[str, Any]) -> dict[str, Any]:
    """--tiny: two small layers of the architecture, its vocabulary kept, so the same paths run."""
    return dict(
        architecture,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=min(2, architecture["num_key_value_heads"]),
    )


# SmolLM2-135M-Instruct's architecture (the config.json its GGUF converts to; rl_engine/demo/smollm2.py): the real
# model's shapes, randomly initialised, since its weights (a 94 MiB GGUF) exceed what one device call carries.
SMOLLM2_135M = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    rope_theta=100000.0,
)
ARCHITECTURES = {"qwen2-0.5b": ("qwen2", QWEN2_05B), "smollm2-135m": ("llama", SMOLLM2_135M)}
TRAINERS = {
    "torch": {"training": "torch"},
    "deepspeed_zero2": {"training": "deepspeed", "zero_stage": 2},
    "deepspeed_zero3": {"training": "deepspeed", "zero_stage": 3},
}
PHASES = ("generate", "reward", "forward_reference", "forward_policy", "train", "weight_sync", "step")
GOAL_MFU = 0.40
GOAL_LOGPROB_GAP = 1e-2
BUDGET_S = 300.0
DEEPSPEED_TIMEOUT_MINUTES = "2"  # DeepSpeed's process-group timeout (its default: 10 minutes); whole minutes
GiB = 2**30


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


def device_environment(device: torch.device) -> dict[str, str]:
    """The environment the check runs (and its trainer processes inherit), each a default the caller's
    environment overrides: DeepSpeed's process-group timeout; on CUDA the fused Adam's build for this GPU's
    architecture into a writable folder, and NCCL on the loopback interface (a world of one needs no network, and
    an NCCL that looks for one can wait out its whole timeout)."""
    wanted = {"DEEPSPEED_TIMEOUT": DEEPSPEED_TIMEOUT_MINUTES}
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        wanted |= {
            "TORCH_CUDA_ARCH_LIST": f"{major}.{minor}",  # 9.0 on an H200
            "MAX_JOBS": str(os.cpu_count() or 1),
            "TORCH_EXTENSIONS_DIR": str(Path(tempfile.gettempdir()) / "torch_extensions"),
            "NCCL_SOCKET_IFNAME": "lo",
            "NCCL_IB_DISABLE": "1",
            "NCCL_DEBUG": "WARN",
        }
    for name, value in wanted.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in wanted}


def build_ops() -> dict[str, Any]:
    """DeepSpeed's set-up step (on CUDA with nvcc: its fused Adam), timed; what the trainers will use."""
    started = time.perf_counter()
    try:
        from rl_engine.backends.deepspeed_trainer import build_ops as build
        from rl_engine.backends.deepspeed_trainer import fused_adam_problem

        built = build()
        problem = fused_adam_problem()
        return {
            "seconds": round(time.perf_counter() - started, 1),
            "ops": built,
            "fused_adam": "loads" if problem is None else f"not used: {problem}",
        }
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def build_task(folder: Path, architecture: dict[str, Any], device: torch.device, family: str = "qwen2") -> None:
    """The demo task's prompts and tokenizer, and a randomly initialised Qwen2 (or Llama) policy of `architecture`
    saved in bf16 as a Hugging Face folder (the engine loads it as it loads any model)."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from rl_engine.demo import task
    from rl_engine.demo.tokenizer import train_tokenizer

    pairs = task.split_pairs(0, 5000, 1000, 100)
    task.write_jsonl(folder / "data" / "train.jsonl", [task.to_row(p) for p in pairs.train])
    tokenizer = train_tokenizer([r["prompt"] + r["label"] for r in map(task.to_row, task.all_pairs())])
    ids = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    config_class, model_class = (
        (LlamaConfig, LlamaForCausalLM) if family == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    )
    config = config_class(**architecture, **ids)
    torch.manual_seed(0)
    with torch.device(device):
        model = model_class(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(**ids)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    parameters = sum(p.numel() for p in model.parameters())
    log(f"policy: {type(model).__name__}, {parameters:,} parameters, vocabulary {config.vocab_size}")
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


def run_trainer(name: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run of the engine's loop, in this (trainer) process: each step's metrics, read back from the run's
    events, and the process's GPU memory before and at its peak."""
    from posttrain_sdk.event_log import read_events
    from rl_engine.config import validate_config
    from rl_engine.loop import train

    cfg = validate_config(run_config(folder, args, TRAINERS[name], args.steps))
    run_dir = folder / "runs" / name
    on_gpu = torch.cuda.is_available() and args.device == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() / GiB if on_gpu else None
    train(cfg, run_dir)
    steps = [
        e["data"] for e in read_events(run_dir / "events.jsonl") if e["type"] == "metrics" and (e.get("step") or 0) >= 1
    ]
    peak = torch.cuda.max_memory_allocated() / GiB if on_gpu else None
    return {"steps": steps, "gpu_memory_before_gb": before, "process_peak_gpu_memory_gb": peak}


class TrainerFailed(Exception):
    """A trainer process failed or was killed; the message holds why and the end of its stderr."""


def run_trainer_process(name: str, folder: Path, deadline: float) -> dict[str, Any]:
    """`run_trainer` in a process of its own (this script, `--trainer-worker`), killed at `deadline`. Its stderr
    goes to ours (the log) and to a file, whose end the error quotes."""
    command = [sys.executable, __file__, *sys.argv[1:], "--trainer-worker", name, "--work-dir", str(folder)]
    stdout, stderr = folder / f"{name}.stdout", folder / f"{name}.stderr"
    with stdout.open("w") as output, stderr.open("w") as errors:
        process = _servers.child(command, stdout=output, stderr=subprocess.PIPE, text=True, start_new_session=True)
        copier = threading.Thread(target=_tee, args=(process.stderr, errors), daemon=True)
        copier.start()
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise TrainerFailed(
                f"killed at the budget's end; the end of its stderr:\n{_servers.log_tail(stderr)}"
            ) from None
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            copier.join(timeout=5)
    lines = [line for line in stdout.read_text().splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        raise TrainerFailed(f"exited with {process.returncode}; the end of its stderr:\n{_servers.log_tail(stderr)}")
    return json.loads(lines[-1])


def _tee(source: Any, copy: Any) -> None:
    for line in source:
        sys.stderr.write(line)
        sys.stderr.flush()
        copy.write(line)
        copy.flush()


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


class Report:
    """The document, rewritten to `path` after every phase: a run killed from outside leaves what it measured."""

    def __init__(self, path: Path | None, document: dict[str, Any]):
        self.path, self.document = path, document
        self.lock = threading.Lock()

    def write(self) -> None:
        if self.path is None:
            return
        with self.lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(".partial")
            partial.write_text(json.dumps(self.document, indent=2) + "\n")
            os.replace(partial, self.path)


class Budget:
    """The whole run's time. Past `seconds` (plus a grace for the last write) a watchdog writes the document with
    the phase that overran, dumps every thread's stack to stderr (the log) and ends the process (exit 3)."""

    GRACE_S = 5.0  # past the deadline: trainers are killed at it, this ends anything else that overran

    def __init__(self, seconds: float, report: Report):
        self.seconds, self.report = seconds, report
        self.started = time.monotonic()
        self.deadline = self.started + seconds
        self.phase = "start"
        self.watchdog = threading.Timer(seconds + self.GRACE_S, self.expire)
        self.watchdog.daemon = True
        self.watchdog.start()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def expire(self) -> None:
        self.report.document["error"] = f"the {self.seconds:g} s budget ran out during {self.phase}"
        self.report.document["total_s"] = round(time.monotonic() - self.started, 1)
        self.report.write()
        log(self.report.document["error"] + "; the stack of every thread follows")
        faulthandler.dump_traceback(all_threads=True)
        print(json.dumps(self.report.document, indent=2), flush=True)
        _servers.stop_all()
        os._exit(3)


def default_out() -> Path | None:
    """$OUT/gpu_check.json where the device run sets OUT (what is under it comes back), else none."""
    return Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer policy and a small batch (dry run)")
    parser.add_argument(
        "--architecture",
        choices=list(ARCHITECTURES),
        default="qwen2-0.5b",
        help="the policy's shapes: Qwen2-0.5B's, or SmolLM2-135M's (the demo's real model, random weights)",
    )
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
    parser.add_argument("--enforce-goals", action="store_true", help="exit 1 when a goal is missed too")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="the whole run's time (see above)")
    parser.add_argument(
        "--out", type=Path, default=default_out(), help="also write the JSON here ($OUT/gpu_check.json)"
    )
    parser.add_argument("--trainer-worker", choices=list(TRAINERS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tiny:
        args.prompts, args.samples, args.new_tokens, args.micro_batch = 4, 4, 8, 8
        args.steps = min(args.steps, 2)
    if args.trainer_worker:
        print(json.dumps(run_trainer(args.trainer_worker, args.work_dir, args)), flush=True)
        return 0

    machine = MachineLoad()
    report = Report(args.out, {"settings": {k: str(v) for k, v in vars(args).items()}})
    if args.device == "cuda" and not torch.cuda.is_available():
        report.document.update(
            error="no CUDA device visible (torch.cuda.is_available() is False)", machine=machine.report()
        )
        report.write()
        print(json.dumps(report.document, indent=2))
        return 1
    budget = Budget(args.budget_s, report)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    document = report.document
    document["architecture"] = args.architecture
    document["environment"] = device_environment(device)
    document["host"] = host_facts(device)
    log(f"host: {document['host']}; environment: {document['environment']}")
    budget.phase = "the bf16 matmul rate"
    document["measured_bf16_tflops"] = measured_bf16_tflops(device)
    document["datasheet_tflops"] = datasheet_tflops(device, args.dtype, args.peak_tflops)
    log(f"bf16 matmul: {document['measured_bf16_tflops']} TFLOP/s measured, datasheet {document['datasheet_tflops']}")
    report.write()
    if any(name.startswith("deepspeed") for name in args.trainers):
        budget.phase = "the DeepSpeed op build"
        document["deepspeed_ops"] = build_ops()
        log(f"DeepSpeed ops: {document['deepspeed_ops']}")
        report.write()

    results: dict[str, Any] = {}
    document["trainers"] = results
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        folder = args.work_dir or Path(tmp)
        budget.phase = "the task build"
        task_started = time.perf_counter()
        family, architecture = ARCHITECTURES[args.architecture]
        build_task(folder, shrunk(architecture) if args.tiny else architecture, device, family)
        document["task_build_s"] = round(time.perf_counter() - task_started, 1)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        longest = 0.0
        for name in args.trainers:
            if budget.left() < longest:
                results[name] = {
                    "error": f"not run: {budget.left():.0f} s of the budget left, the longest trainer took {longest:.0f} s"
                }
                continue
            budget.phase = f"the {name} trainer"
            log(f"{name}: {args.steps} GRPO steps of {args.prompts} x {args.samples} x {args.new_tokens} tokens")
            run_started = time.perf_counter()
            try:
                run = run_trainer_process(name, folder, budget.deadline)
                results[name] = summarise(run["steps"], document["measured_bf16_tflops"], document["datasheet_tflops"])
                results[name]["gpu_memory_before_gb"] = run["gpu_memory_before_gb"]
                results[name]["process_peak_gpu_memory_gb"] = run["process_peak_gpu_memory_gb"]
            except TrainerFailed as exc:
                results[name] = {"error": str(exc)[-3000:]}
            results[name]["wall_s"] = round(time.perf_counter() - run_started, 1)
            longest = max(longest, results[name]["wall_s"])
            log(f"{name}: {json.dumps(results[name])[:2000]}")
            report.write()
    budget.watchdog.cancel()
    document["missed_goals"] = goals(results) if device.type == "cuda" else []
    document["goals_enforced"] = args.enforce_goals
    document["total_s"] = round(time.monotonic() - budget.started, 1)
    document["machine"] = machine.report()
    report.write()
    print(json.dumps(document, indent=2))
    failed = any("error" in r for r in results.values())
    return 1 if failed or (document["missed_goals"] and args.enforce_goals) else 0


if __name__ == "__main__":
    _servers.run_bench(main)
