"""Learning speed: held-out exact-match accuracy against training wall time, ours vs TRL's GRPOTrainer.

Both start from the demo task's warm-start checkpoint, use the same reward (exact match), the same
samples per step (32 prompts x 8 samples = 256 completions) and the same judge (greedy decoding on
the held-out set, `rl_engine.demo.evaluate.evaluate_greedy`). The clock counts training steps only:
it is paused while a system is evaluated. Each (system, seed) runs in its own process, one at a time,
so the two never share the 2 cores, and its peak resident memory is read from the kernel (wait4).

    python bench/learning.py [--minutes 10] [--seeds 0 1 2] [--systems ours trl tool] [--demo-dir .demo/assets]

`tool` is ours with the calculator environment (`rl_engine/environments/calculator.py`): the model may
call the calculator (an expression such as ``37+48``, answered ``=85``) before answering; the reward is
the environment's (1 for a correct final answer, minus 0.05 per call), and its held-out accuracy is
measured the same way with the calculator available (greedy episodes, `eval/env/correct`).

Prints one JSON document: per system and seed the curve [(train_s, accuracy)], accuracy at 2/6/10
minutes, time to reach targets, peak RSS; then medians across seeds and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _emit(**record) -> None:
    print(json.dumps(record), flush=True)


# --- workers (one process per system and seed) -------------------------------------------------


TOOL_ENVIRONMENT = {
    "path": str(REPO / "rl_engine" / "environments" / "calculator.py"),
    "name": "Calculator",
    "max_turns": 3,
    "options": {"call_cost": 0.05, "max_calls": 2},
}


def worker_ours(
    demo: Path,
    seed: int,
    budget_s: float,
    eval_every_s: float,
    eval_rows: list[dict],
    overrides: list[str],
    tool: bool = False,
) -> None:
    import torch

    from rl_engine.__main__ import _resolve_paths, apply_overrides
    from rl_engine.config import validate_config
    from rl_engine.demo.evaluate import evaluate_greedy
    from rl_engine.demo.run_config import demo_run_config
    from rl_engine.loop import build_engine, evaluate, run_step

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    tool_settings = {"environment": TOOL_ENVIRONMENT, "rewards": []} if tool else {}
    base = demo_run_config(
        demo,
        seed=seed,
        train={"steps": 100_000},
        logging={"eval_every": 0},
        checkpoint={"save_final": False, "every_steps": 0},
        **tool_settings,
    ).model_dump(mode="json")
    cfg = _resolve_paths(validate_config(apply_overrides(base, overrides)), demo)
    engine = build_engine(cfg)
    clock, step, next_eval = 0.0, 0, 0.0
    while True:
        if clock >= next_eval or clock >= budget_s:
            extra = {}
            if tool:  # episodes with the calculator available, greedy: the environment judges the answer
                result = evaluate(engine, engine.data.eval[: len(eval_rows)], 6)
                accuracy, extra = result["eval/env/correct"], {"calls_per_episode": result["eval/env/calls"]}
            else:
                accuracy = evaluate_greedy(engine.model, engine.tokenizer, eval_rows)
            _emit(train_s=round(clock, 2), step=step, accuracy=accuracy, **extra)
            next_eval += eval_every_s
            if clock >= budget_s:
                break
        started = time.perf_counter()
        step += 1
        run_step(engine, step)
        clock += time.perf_counter() - started
    engine.close()


def worker_trl(
    demo: Path, seed: int, budget_s: float, eval_every_s: float, eval_rows: list[dict], overrides: list[str]
) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rl_engine.demo.evaluate import evaluate_greedy
    from rl_engine.rewards import ExactMatch, RewardBatch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    tokenizer = AutoTokenizer.from_pretrained(demo / "model")
    model = AutoModelForCausalLM.from_pretrained(demo / "model", dtype=torch.float32)
    train = Dataset.from_list(_read_rows(demo / "data" / "train.jsonl"))
    judge = ExactMatch()

    def correct(prompts, completions, label, **_):
        return judge.score(RewardBatch.build(prompts, completions, label)).scores

    extra = dict(item.split("=", 1) for item in overrides)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-grpo-"),
        use_cpu=True,
        seed=seed,
        report_to="none",
        learning_rate=float(extra.get("lr", 1e-4)),
        lr_scheduler_type="constant",
        beta=0.0,
        num_generations=8,
        per_device_train_batch_size=256,
        gradient_accumulation_steps=1,
        max_completion_length=6,
        temperature=1.0,
        max_steps=100_000,
        logging_steps=1_000_000,
        save_strategy="no",
        dataloader_num_workers=0,
        bf16=False,
        disable_tqdm=True,
    )

    class Clock(TrainerCallback):
        def __init__(self):
            self.clock, self.next_eval, self.started = 0.0, 0.0, 0.0

        def evaluate(self, step: int) -> None:
            _emit(train_s=round(self.clock, 2), step=step, accuracy=evaluate_greedy(model, tokenizer, eval_rows))
            self.next_eval += eval_every_s

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 0 and self.next_eval == 0.0:
                self.evaluate(0)
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.clock += time.perf_counter() - self.started
            if self.clock >= self.next_eval or self.clock >= budget_s:
                self.evaluate(state.global_step)
            if self.clock >= budget_s:
                control.should_training_stop = True

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=correct,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()


# --- the driver -----------------------------------------------------------------------------------


def run_worker(system: str, seed: int, args: argparse.Namespace) -> dict:
    command = [
        sys.executable,
        __file__,
        "--worker",
        system,
        "--seed",
        str(seed),
        "--minutes",
        str(args.minutes),
        "--eval-every-s",
        str(args.eval_every_s),
        "--demo-dir",
        str(args.demo_dir),
        "--eval-size",
        str(args.eval_size),
    ]
    for item in args.trl_set if system == "trl" else args.set:
        command += ["--trl-set" if system == "trl" else "--set", item]
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    output = ""
    for line in process.stdout:  # echoed as it comes, so a long bench shows progress and leaves a trace
        output += line
        if _curve_point(line) is not None:
            print(f"{system} seed {seed}: {line.strip()}", file=sys.stderr, flush=True)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    curve = [point for line in output.splitlines() if (point := _curve_point(line)) is not None]
    if process.returncode != 0 or not curve:
        raise RuntimeError(f"{system} seed {seed} failed (exit {process.returncode}); run the worker alone to see why")
    return {
        "seed": seed,
        "curve": [(p["train_s"], p["accuracy"]) for p in curve],
        "steps": curve[-1]["step"],
        **({"calls_per_episode": [p["calls_per_episode"] for p in curve]} if "calls_per_episode" in curve[-1] else {}),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "process_wall_s": round(time.monotonic() - started, 1),
    }


def _curve_point(line: str) -> dict | None:
    """A worker's evaluation line; anything else it prints (TRL's own summary dict) is not one."""
    try:
        point = json.loads(line)
    except ValueError:
        return None
    return point if isinstance(point, dict) and "accuracy" in point else None


def accuracy_at(curve: list[tuple[float, float]], seconds: float) -> float | None:
    """The last evaluation at or before `seconds` of training."""
    seen = [acc for t, acc in curve if t <= seconds + 1e-6]
    return seen[-1] if seen else None


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, acc in curve if acc >= target), None)


def summarize(results: dict[str, list[dict]], minutes: float) -> dict:
    marks = sorted({m for m in (2, 6, 10) if m <= minutes} | {minutes})
    summary: dict = {}
    for system, runs in results.items():
        per_mark = {
            f"accuracy_at_{m}min": statistics.median(
                [a for r in runs if (a := accuracy_at(r["curve"], m * 60)) is not None] or [float("nan")]
            )
            for m in marks
        }
        summary[system] = {
            **per_mark,
            "steps_median": statistics.median(r["steps"] for r in runs),
            "peak_rss_mib_max": max(r["peak_rss_mib"] for r in runs),
        }
    if "ours" in results and "tool" in results:
        marks_key = f"accuracy_at_{marks[-1]}min"
        summary["tool_minus_single_turn_final_accuracy"] = round(
            summary["tool"][marks_key] - summary["ours"][marks_key], 4
        )
    if "ours" in results and "trl" in results:
        trl_final = summary["trl"][f"accuracy_at_{marks[-1]}min"]
        times = [time_to(r["curve"], trl_final) for r in results["ours"]]
        reached = [t for t in times if t is not None]
        summary["ours_time_to_trl_final_accuracy_s"] = (
            statistics.median(reached) if len(reached) == len(times) else None
        )
        summary["ours_time_to_trl_final_ratio"] = (
            round(summary["ours_time_to_trl_final_accuracy_s"] / (marks[-1] * 60), 3)
            if summary["ours_time_to_trl_final_accuracy_s"] is not None
            else None
        )
        times90 = [time_to(r["curve"], 0.9) for r in results["ours"]]
        summary["ours_time_to_90pct_s"] = statistics.median(times90) if all(t is not None for t in times90) else None
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--systems", nargs="+", default=["ours", "trl"], choices=["ours", "trl", "tool"])
    parser.add_argument("--demo-dir", type=Path, default=REPO / ".demo" / "assets")
    parser.add_argument("--eval-every-s", type=float, default=30.0)
    parser.add_argument("--eval-size", type=int, default=1000, help="held-out prompts per evaluation (>= 500: noise)")
    parser.add_argument("--set", action="append", default=[], help="override our run config, e.g. train.lr=1e-3")
    parser.add_argument("--trl-set", action="append", default=[], help="TRL option, e.g. lr=1e-4")
    parser.add_argument("--worker", choices=["ours", "trl", "tool"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        eval_rows = _read_rows(args.demo_dir / "data" / "test.jsonl")[: args.eval_size]
        if args.worker == "trl":
            worker_trl(args.demo_dir, args.seed, args.minutes * 60, args.eval_every_s, eval_rows, args.trl_set)
        else:
            worker_ours(
                args.demo_dir,
                args.seed,
                args.minutes * 60,
                args.eval_every_s,
                eval_rows,
                args.set,
                tool=args.worker == "tool",
            )
        return

    from rl_engine.demo.run_config import build_demo_assets

    build_demo_assets(args.demo_dir)
    manifest = json.loads((args.demo_dir / "manifest.json").read_text())
    results = {system: [run_worker(system, seed, args) for seed in args.seeds] for system in args.systems}
    print(
        json.dumps(
            {
                "bench": "learning",
                "minutes": args.minutes,
                "seeds": args.seeds,
                "threads": os.environ["OMP_NUM_THREADS"],
                "warm_start_accuracy": manifest.get("warm_start", {}).get("test_accuracy"),
                "overrides": {"ours": args.set, "trl": args.trl_set},
                "summary": summarize(results, args.minutes),
                "runs": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
