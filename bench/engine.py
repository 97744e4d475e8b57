"""GRPO step time of our engine against TRL's `GRPOTrainer`, on the same model, data, reward and batch shape; plus,
from our own runs: vLLM rollout tokens/s against transformers `generate`, weight sync's share of the step, the
largest |log-prob(vLLM) - log-prob(trainer)| after a sync, and the per-phase step breakdown and per-role peak
memory for placement colocate/separate and sync/async rollout.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 .venv/bin/python bench/engine.py [--shape tiny|medium|both] [--steps N]
        [--configs colocate-sync separate-sync separate-async] [--backends transformers vllm]
        [--dtype float32 bfloat16] [--skip-trl] [--cache-dir .demo] [--demo-dir DIR] [--retries 1] [--quiet-s 60]
        [--timeout-s 1800]

Shapes: `tiny` is the demo task's policy (~1M parameters, warm-started) with the demo run config's batch
(32 prompts x 8 samples x 6 new tokens, one micro-batch; `--demo-dir` uses another demo build as it is, e.g. a tiny
one for a smoke run, whose heads are too narrow for vLLM's CPU attention: `--backends transformers`); `medium` is the same architecture at ~49M parameters,
randomly initialised, 32 prompts x 4 samples x 128 new tokens, micro-batches of 32, bf16 by default.

Each of our configurations is one `python -m rl_engine train` process; TRL runs in its own process too (this
script with `--worker trl`), one at a time, with the same OMP_NUM_THREADS. Step time is the median over the steps
after the first (which pays warm-ups). A configuration the engine refuses (exit code 2) is recorded as
`{"error": <its last stderr line>}` and the bench goes on. Before each process the bench waits (--quiet-s) for the
CPUs to go idle; it counts the CPU time of the process's session (Ray's actors and vLLM's engine included) against
the machine's, and runs a process again (--retries) when other work took over a quarter core meanwhile: on 2 cores
torch's OpenMP threads then spin and a step grows many-fold. Runs still shared are listed in `contended_runs`.

Prints one JSON document on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers
from bench._machine import MachineLoad
from bench._servers import REPO

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Our configurations (the breakdown); each also runs with every --backends rollout backend.
CONFIGS: dict[str, list[str]] = {
    "colocate-sync": [],
    "separate-sync": ["placement.mode=separate"],
    "separate-async": ["placement.mode=separate", "backends.async_rollout=true"],
    "separate-async4": ["placement.mode=separate", "backends.async_rollout=true", "backends.max_staleness=4"],
    "separate-async4-partial": [
        "placement.mode=separate",
        "backends.async_rollout=true",
        "backends.max_staleness=4",
        "backends.partial_rollout=true",
    ],
}
# Small enough that every role fits a Ray cluster of 2 CPUs.
PLACEMENT = ["placement.cpus_per_rollout_engine=0.5", "placement.cpus_per_trainer=0.5"]
RUN_CONFIG = "bench-engine.yaml"


@dataclass(frozen=True)
class Shape:
    size: str  # rl_engine.demo.build.MODEL_SIZES
    folder: str  # under --cache-dir
    rollout: dict[str, Any]  # overrides of the demo run config's rollout section ({} = the demo's batch)
    micro_batch_size: int | None  # None = the demo run config's
    steps: int
    dtype: str


SHAPES = {
    "tiny": Shape("demo", "assets", {}, None, steps=6, dtype="float32"),
    # stop stays empty: only eos ends a response, on both sides.
    "medium": Shape(
        "medium",
        "bench-medium",
        {"prompts_per_step": 32, "samples_per_prompt": 4, "max_new_tokens": 128, "stop": []},
        32,
        steps=4,
        dtype="bfloat16",
    ),
}


NOTES = {
    "tiny": "the demo policy (MODEL_SIZES['demo']); MODEL_SIZES['tiny'] is too small for vLLM's CPU attention "
    "(heads under 32 wide), so the demo size is the smallest both backends run",
    "medium": "random weights (no warm start): every reward is 0, so the update moves nothing and each step samples "
    "from the same policy; eos ends responses early at random, alike on both sides (see "
    "response_length_mean and tokens_per_s)",
}


def log(message: str) -> None:
    print(f"[bench engine] {message}", file=sys.stderr, flush=True)


# --- assets ------------------------------------------------------------------------------------------------------


def prepare(shape: Shape, cache: Path, steps: int, work: Path, demo_dir: Path | None = None) -> tuple[Path, dict]:
    """Builds (or reuses) the shape's model and data; writes our run config (absolute paths) into `work`. Returns
    the config's path and the build manifest. `demo_dir`: the tiny shape's demo build, used as it is."""
    from bench._models import build_policy
    from rl_engine.config import dump_config
    from rl_engine.demo.run_config import build_demo_assets, demo_run_config

    folder = cache / shape.folder
    if shape.size == "demo" and demo_dir is not None:
        folder = demo_dir
    elif shape.size == "demo":
        build_demo_assets(folder)  # the demo task exactly as `python -m rl_engine demo build` makes it
    else:
        # Random weights: the warm start would teach "answer then eos" and cut responses to ~4 tokens; a random
        # policy ends a response with eos at ~1/262 per token, the same chance on both sides. 256 positions fit a
        # prompt plus 128 new tokens.
        build_policy(folder, shape.size, sft_steps=0, max_positions=256, progress=False)
    manifest = json.loads((folder / "manifest.json").read_text())
    train = {"steps": steps} | ({"micro_batch_size": shape.micro_batch_size} if shape.micro_batch_size else {})
    cfg = demo_run_config(
        folder,
        model={"path": str(folder / "model")},
        data={"path": str(folder / "data" / "train.jsonl"), "eval_path": str(folder / "data" / "test.jsonl")},
        rollout=shape.rollout,
        train=train,
        # No evaluation, no sample events (TRL logs no completions either), no checkpoints.
        logging={"eval_every": 0, "samples": "none"},
        checkpoint={"every_steps": 0, "save_final": False},
    )
    path = work / f"{shape.folder}-{RUN_CONFIG}"
    path.write_text(dump_config(cfg))
    return path, manifest


# --- processes ---------------------------------------------------------------------------------------------------


@dataclass
class Finished:
    exit_code: int
    wall_s: float
    peak_rss_gb: float  # the largest resident set of the process and its waited-for children (wait4)
    stderr_tail: str
    busy_cores_before: float  # CPU use on the machine just before the start (all processes)
    own_cores: float  # mean cores the run's processes used (its session: Ray's actors and vLLM's engine included)
    other_cores: float  # mean cores everything else on the machine used meanwhile (0 = the run had the machine)
    load_1m: tuple[float, float]
    attempts: int = 1


_TICK = os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds spent busy since boot, all cores together (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / _TICK  # less idle and iowait


def session_cpu(sid: int, seen: dict[int, float]) -> None:
    """Records the CPU seconds of every live process of session `sid` into `seen` (pid -> seconds)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[3]) == sid:  # after the name: state ppid pgrp session ... utime(11) stime(12)
            seen[int(entry.name)] = (int(fields[11]) + int(fields[12])) / _TICK


def wait_quiet(limit_s: float, threshold: float = 0.3) -> float:
    """Waits (up to `limit_s`) until under `threshold` cores are busy, so a run does not share the CPUs with the
    previous run's leftovers (Ray actors shutting down) or other work; returns the last busy figure."""
    deadline = time.monotonic() + limit_s
    while True:
        t, busy = time.monotonic(), machine_busy_s()
        time.sleep(2.0)
        cores = (machine_busy_s() - busy) / (time.monotonic() - t)
        if cores <= threshold or time.monotonic() >= deadline:
            return cores


def kill_session(sid: int) -> None:
    """SIGKILL to every process of session `sid` (one this bench started)."""
    members: dict[int, float] = {}
    session_cpu(sid, members)
    for member in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def run_process(command: list[str], log_path: Path, timeout_s: float, quiet_s: float) -> Finished:
    """Runs `command` in its own session with stdout+stderr to `log_path`. Every process it starts (Ray's actors
    too, which get process groups of their own) stays in that session: their CPU time is counted as the run's,
    and they are all killed after `timeout_s` or when the bench itself is stopped."""
    busy_before = wait_quiet(quiet_s)
    load_before = os.getloadavg()[0]
    started, machine_started = time.monotonic(), machine_busy_s()
    with log_path.open("w") as out:
        process = _servers.child(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    seen: dict[int, float] = {}
    timed_out = False
    try:
        while True:
            session_cpu(process.pid, seen)  # a process that exits keeps its last sample (<= 0.5 s short)
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - started > timeout_s:
                timed_out = True
                kill_session(process.pid)
                _, status, usage = os.wait4(process.pid, 0)
                break
            time.sleep(0.5)
    except BaseException:  # Ctrl-C or SIGTERM (see main): the run must not outlive the bench
        kill_session(process.pid)
        raise
    wall = time.monotonic() - started
    own = sum(seen.values())
    other = max(0.0, machine_busy_s() - machine_started - own)
    lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    tail = f"timed out after {timeout_s:.0f} s" if timed_out else (lines[-1] if lines else "")
    if timed_out or os.waitstatus_to_exitcode(status) != 0:
        log(f"{' '.join(command[1:4])} failed; the end of its output ({log_path}):\n{_servers.log_tail(log_path)}")
    return Finished(
        os.waitstatus_to_exitcode(status),
        wall,
        usage.ru_maxrss / 2**20,
        tail,
        busy_before,
        own / wall,
        other / wall,
        (load_before, os.getloadavg()[0]),
    )


CONTENDED_CORES = 0.25  # other work above this (mean cores over a run) makes its times incomparable


def run_measured(command: list[str], log_path: Path, output: Path, args: argparse.Namespace) -> Finished:
    """`run_process`, again (up to --retries times) while other work shared the CPUs: torch's OpenMP threads spin
    when a core is taken, and a step then grows many-fold. `output` (the run's folder or file) is removed before
    each attempt. Returns the last attempt, with how many were made."""
    for attempt in range(1, args.retries + 2):
        if output.is_dir():
            shutil.rmtree(output)
        else:
            output.unlink(missing_ok=True)
        done = run_process(command, log_path, args.timeout_s, args.quiet_s)
        done.attempts = attempt
        if done.other_cores <= CONTENDED_CORES or done.exit_code != 0:
            break
        log(
            f"other work used {done.other_cores:.2f} cores meanwhile; "
            + ("running it again" if attempt <= args.retries else "keeping it (see contended_runs)")
        )
    return done


def process_fields(done: Finished) -> dict[str, Any]:
    return {
        "exit_code": done.exit_code,
        "wall_s": round(done.wall_s, 1),
        "process_peak_rss_gb": _r(done.peak_rss_gb, 3),
        "busy_cores_before": round(done.busy_cores_before, 2),
        "own_cores": round(done.own_cores, 2),
        "other_cores": round(done.other_cores, 2),
        "attempts": done.attempts,
        "load_1m_before_after": [round(x, 2) for x in done.load_1m],
    }


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def run_ours(config: Path, sets: list[str], work: Path, name: str, args: argparse.Namespace) -> dict[str, Any]:
    from posttrain_sdk.event_log import read_events

    run_dir = work / name
    command = [sys.executable, "-m", "rl_engine", "train", str(config), "--run-dir", str(run_dir), "--no-progress"]
    for item in sets:
        command += ["--set", item]
    log(f"ours {name}: {' '.join(sets)}")
    done = run_measured(command, work / f"{name}.log", run_dir, args)
    process = process_fields(done)
    metrics = [e for e in read_events(run_dir / "events.jsonl") if e["type"] == "metrics" and (e["step"] or 0) >= 1]
    if done.exit_code != 0 or not metrics:
        log(f"ours {name}: failed: {done.stderr_tail}")
        return {"error": done.stderr_tail, **process}
    result = summarize_ours(metrics) | process
    log(f"ours {name}: step {result['step_s']} s, {result['tokens_per_s']} tokens/s ({done.wall_s:.0f} s)")
    return result


def summarize_ours(metrics: list[dict]) -> dict[str, Any]:
    """Medians of every timing/* over the steps after the first; the max of every memory/*."""
    later = [e for e in metrics if e["step"] > 1] or metrics
    data = [e["data"] for e in later]
    numbers = lambda key, rows: [d[key] for d in rows if isinstance(d.get(key), (int, float))]  # noqa: E731
    median = lambda key: statistics.median(numbers(key, data)) if numbers(key, data) else None  # noqa: E731
    keys = sorted({k for e in metrics for k in e["data"]})
    timing = {k: _r(median(k)) for k in keys if k.startswith("timing/")}
    memory = {k: _r(max(numbers(k, [e["data"] for e in metrics])), 3) for k in keys if k.startswith("memory/")}
    # Event times also count what happens outside `run_step` (events, an async pipeline's hand-offs).
    times = [e["time"] for e in metrics]
    intervals = [b - a for a, b in zip(times, times[1:])]
    step = median("timing/step")
    sync = median("timing/weight_sync")
    result: dict[str, Any] = {
        "steps_measured": len(later),
        "step_s": _r(step),
        "step_interval_s": _r(statistics.median(intervals)) if intervals else None,
        "tokens_per_s": _r(median("throughput/tokens_per_s"), 1),
        "response_length_mean": _r(statistics.fmean(numbers("response/length_mean", data)), 2),
        "truncated_rate": _r(statistics.fmean(numbers("response/truncated_rate", data)), 3),
        "weight_sync_share": _r(sync / step) if sync is not None and step else None,
        "timing": timing,
        "memory": memory,
        "memory_sum_gb": _r(sum(memory.values()), 3) if memory else None,
    }
    gaps = numbers("rollout/logprob_diff_max", [e["data"] for e in metrics])
    if gaps:  # every step, the first included: each compares the engine with the trainer under the same weights
        result["logprob_diff_max"] = max(gaps)
    kl = numbers("kl/rollout_vs_policy", data)
    if kl:
        result["kl_rollout_vs_policy"] = {"median": _r(statistics.median(kl), 6), "max": _r(max(kl), 6)}
    return result


def run_trl(cfg_path: Path, dtype: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    out = work / "trl.jsonl"
    command = [
        sys.executable,
        __file__,
        "--worker",
        "trl",
        "--worker-config",
        str(cfg_path),
        "--worker-dtype",
        dtype,
        "--worker-out",
        str(out),
    ]
    log(f"TRL GRPOTrainer ({dtype})")
    done = run_measured(command, work / "trl.log", out, args)
    process = process_fields(done)
    steps = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if done.exit_code != 0 or not steps:
        log(f"TRL failed: {done.stderr_tail}")
        return {"error": done.stderr_tail, **process}
    later = steps[1:] or steps
    median = lambda key: statistics.median(s[key] for s in later)  # noqa: E731
    intervals = [b["end"] - a["end"] for a, b in zip(steps, steps[1:])]
    result = {
        "steps_measured": len(later),
        "step_s": _r(median("step_s")),
        "step_interval_s": _r(statistics.median(intervals)) if intervals else None,
        "generate_s": _r(median("generate_s")),
        "tokens_per_s": _r(median("tokens_per_s"), 1),
        "response_length_mean": _r(statistics.fmean(s["length_mean"] for s in later), 2),
        "truncated_rate": _r(statistics.fmean(s["clipped_ratio"] or 0.0 for s in later), 3),
        **process,
    }
    log(f"TRL: step {result['step_s']} s, generate {result['generate_s']} s ({done.wall_s:.0f} s)")
    return result


# --- TRL worker (its own process) ---------------------------------------------------------------------------------


def worker_trl(cfg_path: Path, dtype: str, out: Path) -> None:
    """TRL's GRPOTrainer with our run config's model, data, reward and batch; one JSON line per step into `out`."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rl_engine.__main__ import load_run_config
    from rl_engine.demo.task import read_jsonl
    from rl_engine.devices import DTYPES
    from rl_engine.rewards import ExactMatch, RewardBatch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = load_run_config(str(cfg_path), [])
    ro, tr, alg = cfg.rollout, cfg.train, cfg.algorithm
    samples = cfg.samples_per_step
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=DTYPES[dtype])
    judge = ExactMatch()  # our exact_match component itself, so both sides score alike

    def correct(prompts: list[str], completions: list[str], label: list[str], **_: Any) -> list[float]:
        return judge.score(RewardBatch.build(prompts, completions, label)).scores

    args = GRPOConfig(
        output_dir=str(out.parent / "trl-output"),
        use_cpu=True,
        seed=cfg.seed,
        report_to=[],
        bf16=dtype == "bfloat16",
        gradient_checkpointing=False,  # TRL turns checkpointing on by default; ours is off
        learning_rate=tr.lr,
        lr_scheduler_type="constant",
        max_grad_norm=tr.grad_clip or 0.0,
        adam_beta1=tr.betas[0],
        adam_beta2=tr.betas[1],
        weight_decay=tr.weight_decay,
        beta=0.0,
        loss_type="dapo",  # no KL; dapo = our token_mean (one process, one generation per update)
        epsilon=alg.clip_range[0],
        epsilon_high=alg.clip_range[1],
        num_iterations=1,
        # One optimizer step per generation batch of prompts x samples, in micro-batches of our size.
        num_generations=ro.samples_per_prompt,
        per_device_train_batch_size=tr.micro_batch_size,
        gradient_accumulation_steps=samples // tr.micro_batch_size,
        generation_batch_size=samples,
        max_completion_length=ro.max_new_tokens,
        temperature=ro.temperature,
        top_p=ro.top_p,
        top_k=0,
        max_steps=tr.steps,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    train = Dataset.from_list(read_jsonl(Path(cfg.data.path)))
    generate_s: list[float] = []

    class Clock(TrainerCallback):
        started = 0.0
        step: dict[str, float] | None = None  # the step just ended, written out with its logged metrics

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()
            generate_s.clear()

        def on_step_end(self, args, state, control, **kwargs):
            self.step = {
                "step": state.global_step,
                "step_s": time.perf_counter() - self.started,
                "end": time.perf_counter(),
                "generate_s": sum(generate_s),
            }

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs and self.step is not None:
                length = logs["completions/mean_length"]
                tokens = length * samples
                record = self.step | {
                    "length_mean": length,
                    "clipped_ratio": logs.get("completions/clipped_ratio"),
                    "tokens_per_s": tokens / max(self.step["generate_s"], 1e-9),
                }
                with out.open("a") as f:
                    f.write(json.dumps(record) + "\n")

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=correct,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    inner = trainer._generate_single_turn

    def timed_generate(*a: Any, **k: Any) -> Any:  # TRL's sampling call alone, for tokens/s
        t = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            generate_s.append(time.perf_counter() - t)

    trainer._generate_single_turn = timed_generate
    trainer.train()


# --- the driver --------------------------------------------------------------------------------------------------


def bench_shape(name: str, dtype: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    shape = SHAPES[name]
    steps = args.steps or shape.steps
    config, manifest = prepare(shape, args.cache_dir, steps, work, args.demo_dir)
    from rl_engine.config import load_config

    cfg = load_config(config)
    ours: dict[str, dict[str, Any]] = {}
    trl = None

    def run_config(config_name: str) -> None:
        for backend in args.backends:
            sets = [f"backends.rollout={backend}", f"model.dtype={dtype}", *PLACEMENT, *CONFIGS[config_name]]
            ours.setdefault(config_name, {})[backend] = run_ours(
                config, sets, work, f"{name}-{dtype}-{config_name}-{backend}", args
            )

    # The like-for-like pair (colocate-sync and TRL) back to back, the other configurations after.
    first = [c for c in args.configs if c == "colocate-sync"]
    for config_name in first:
        run_config(config_name)
    if not args.skip_trl:
        trl = run_trl(config, dtype, work, args)
    for config_name in args.configs:
        if config_name not in first:
            run_config(config_name)
    return {
        "shape": name,
        "dtype": dtype,
        "steps": steps,
        "note": NOTES[name],
        "model": {
            "size": manifest.get("model_size", shape.size),
            "parameters": manifest["model"]["parameters"],
            "warm_start_steps": manifest["sft"]["steps"],
            "path": cfg.model.path,
        },
        "batch": {
            "prompts": cfg.rollout.prompts_per_step,
            "samples_per_prompt": cfg.rollout.samples_per_prompt,
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "micro_batch_size": cfg.train.micro_batch_size,
            "lr": cfg.train.lr,
            "temperature": cfg.rollout.temperature,
        },
        "ours": ours,
        "trl": trl,
        "comparison": compare(ours, trl),
    }


def compare(ours: dict[str, dict[str, Any]], trl: dict[str, Any] | None) -> dict[str, Any]:
    """The headline figures from the colocate-sync runs (the like-for-like ones)."""
    runs = {b: r for b, r in ours.get("colocate-sync", {}).items() if "error" not in r}
    out: dict[str, Any] = {}
    if trl and "error" not in trl:
        out["step_s_ours_over_trl"] = {b: _r(r["step_s"] / trl["step_s"], 3) for b, r in runs.items()}
        out["tokens_per_s_ours_over_trl"] = {b: _r(r["tokens_per_s"] / trl["tokens_per_s"], 3) for b, r in runs.items()}
    if "vllm" in runs and "transformers" in runs:
        out["rollout_tokens_per_s"] = {
            "vllm": runs["vllm"]["tokens_per_s"],
            "transformers": runs["transformers"]["tokens_per_s"],
            "vllm_over_transformers": _r(runs["vllm"]["tokens_per_s"] / runs["transformers"]["tokens_per_s"], 3),
        }
    if "vllm" in runs:
        out["vllm_weight_sync_share"] = runs["vllm"]["weight_sync_share"]
        out["vllm_logprob_diff_max"] = runs["vllm"].get("logprob_diff_max")
    return out


def contended(results: list[dict[str, Any]]) -> list[str]:
    names = []
    for result in results:
        prefix = f"{result['shape']}/{result['dtype']}"
        runs = {f"{c}/{b}": r for c, by_backend in result["ours"].items() for b, r in by_backend.items()}
        runs["trl"] = result["trl"] or {}
        names += [f"{prefix}/{n}" for n, r in runs.items() if r.get("other_cores", 0.0) > CONTENDED_CORES]
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description="GRPO step time, ours vs TRL's GRPOTrainer; our phase breakdown.")
    parser.add_argument("--shape", default="tiny", choices=["tiny", "medium", "both"])
    parser.add_argument("--steps", type=int, help="steps per run, the first a warm-up (default: tiny 6, medium 4)")
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=list(CONFIGS),
        help="our configurations (default: tiny all three, medium colocate-sync)",
    )
    parser.add_argument("--backends", nargs="+", default=["transformers", "vllm"], choices=["transformers", "vllm"])
    parser.add_argument(
        "--dtype", nargs="+", choices=["float32", "bfloat16"], help="default: tiny float32, medium bfloat16"
    )
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".demo", help="where the built models are kept")
    parser.add_argument(
        "--demo-dir", type=Path, help="the tiny shape's demo build, used as it is (default: --cache-dir's assets)"
    )
    parser.add_argument("--timeout-s", type=float, default=1800, help="per process")
    parser.add_argument(
        "--quiet-s", type=float, default=60, help="before each process, wait up to this long for the CPUs to go idle"
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=1,
        help=f"runs again a process that shared the CPUs with other work (over {CONTENDED_CORES} cores on average)",
    )
    parser.add_argument("--worker", choices=["trl"], help=argparse.SUPPRESS)
    parser.add_argument("--worker-config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--worker-dtype", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_trl(args.worker_config, args.worker_dtype, args.worker_out)
        return

    if args.demo_dir is not None:
        args.demo_dir = args.demo_dir.resolve()
    machine = MachineLoad()
    # stdout carries the JSON only; whatever the imports print goes to stderr.
    json_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    shapes = ["tiny", "medium"] if args.shape == "both" else [args.shape]
    started = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as folder:
        for name in shapes:
            chosen = args.configs or (list(CONFIGS) if name == "tiny" else ["colocate-sync"])
            for dtype in args.dtype or [SHAPES[name].dtype]:
                shape_started = time.monotonic()
                run_args = argparse.Namespace(**{**vars(args), "configs": chosen})
                result = bench_shape(name, dtype, run_args, Path(folder))
                result["wall_s"] = round(time.monotonic() - shape_started, 1)
                results.append(result)
    report = {
        "bench": "engine",
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cpus": os.cpu_count(),
        "wall_s": round(time.monotonic() - started, 1),
        # Runs that shared the CPUs with other work even after --retries: their times are not comparable.
        "contended_runs": contended(results),
        "results": results,
        "machine": machine.report(),
    }
    print(json.dumps(report, indent=1), file=json_out, flush=True)


if __name__ == "__main__":
    _servers.run_bench(main)
