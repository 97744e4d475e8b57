"""Learning speed: held-out exact-match accuracy against training wall time, our recipes vs TRL's GRPOTrainer.

Both start from the demo task's warm-start checkpoint, use the same reward (exact match), the same
samples per step (32 prompts x 8 samples = 256 completions, unless a recipe changes it) and the same
judge (greedy decoding on the held-out set, `rl_engine.demo.evaluate.evaluate_greedy`). The clock counts
training steps only: it is paused while a system is evaluated. Each (system, seed) runs in its own
process, one at a time, so two never share the 2 cores, and its peak resident memory is read from the
kernel (wait4); each run records the machine's load average at its start and end (a figure taken above one
runnable process per core is to be taken again on a quieter machine), and a run that fails ends the bench with
the tail of its stderr (all of it in OUT/logs/).

    .venv/bin/python bench/learning.py [--minutes 10] [--seeds 0 1] [--systems ours trl tool]
        [--recipes default gspo cispo gmpo] [--recipe-file RECIPE.yaml ...] [--out DIR] [--demo-dir .demo/assets]
    .venv/bin/python bench/learning.py --search [--screen-minutes 3] [--top 2] [--search-losses ...] [--search-lr ...]
        [--search-prompts ...] [--minutes 10] [--seeds 0 1] [--out DIR]

Recipes. `ours` runs each of `--recipes` (named in RECIPES: the demo run config, and each policy loss
swapped in with its own clip range and aggregation) and each `--recipe-file` (a run config this bench
wrote, to re-run a recipe exactly); `--set key=value` changes every one of them. `--search` screens a grid
of recipes (policy loss x learning rate x prompts per step) for `--screen-minutes` on the first seed,
then runs the `--top` best for `--minutes` on every seed next to TRL. Every recipe's full run config is
written to `OUT/recipes/<label>.yaml` (it trains as it is with `python -m rl_engine train`, and this bench
re-runs it with `--recipe-file`), TRL's GRPOConfig to `OUT/recipes/trl.json`, the results to
`OUT/results.json`.

Evaluations run at every multiple of `--eval-every-s` and at every summary mark (each whole minute, and
the end), each tagged with the time it was due: it runs at the first step boundary after that, a few
milliseconds late, and the summary's accuracy at a mark is the evaluation due at that mark.

`tool` is the default recipe with the calculator environment (`rl_engine/environments/calculator.py`):
the model may call the calculator (an expression such as ``37+48``, answered ``=85``) before answering;
the reward is the environment's (1 for a correct final answer, minus 0.05 per call), and its held-out
accuracy is measured the same way with the calculator available (greedy episodes, `eval/env/correct`).

Prints one JSON document (also written to OUT/results.json): per system and seed the curve, then per
system the median accuracy at each mark, time to 90% and from when 90% held, and against TRL the time to
reach TRL's final accuracy.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers
from bench._machine import MachineLoad, load_average
from bench._servers import REPO

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

#: The recipes `--recipes` names: sections merged into the demo run config (rl_engine/demo/run_config.py:
#: GRPO, PPO clip 0.2 / 0.28, lr 1e-4 decaying by a cosine over `--steps` (without `--steps`, over 100,000 steps:
#: about constant for the minutes a timed run lasts), 32 x 8 samples). A policy loss other than PPO's takes its own clip
#: range and aggregation (the catalogue's defaults), not PPO's.
OWN_CLIPS = {"clip_low": None, "clip_high": None}
#: Async mode, generation up to N updates ahead on a rollout actor of its own (placement separate), `default`
#: being the same recipe in sync mode: `asyncN` takes the loss's ratio against the rollout engine's log-probs
#: (`algorithm.ratio_against: auto`) and logs the mismatch (`rollout_correction: metrics`, the loss unchanged);
#: `asyncN_tis` weighs PPO's loss by token TIS (the ratio then against the trainer's log-probs);
#: `asyncN_decoupled` is decoupled PPO with token TIS as its behaviour weight.
ASYNC_STALENESS = (1, 2, 4)


def _async(staleness: int, algorithm: dict[str, Any]) -> dict[str, Any]:
    return {
        "backends": {"async_rollout": True, "max_staleness": staleness},
        "placement": {"mode": "separate"},
        "algorithm": algorithm,
    }


RECIPES: dict[str, dict[str, Any]] = {
    "default": {},
    # The demo's recipe before its cosine decay (bench/README.md, "The toy's stability").
    "constant_lr": {"train": {"lr_schedule": "constant", "warmup_steps": 0}},
    "gspo": {"algorithm": {"policy_loss": "gspo", **OWN_CLIPS}},
    "cispo": {"algorithm": {"policy_loss": "cispo", **OWN_CLIPS}},
    "gmpo": {"algorithm": {"policy_loss": "gmpo", **OWN_CLIPS}},
    **{f"async{n}": _async(n, {"rollout_correction": {"method": "metrics"}}) for n in ASYNC_STALENESS},
    **{f"async{n}_tis": _async(n, {"rollout_correction": {"method": "token_tis"}}) for n in ASYNC_STALENESS},
    **{
        f"async{n}_decoupled": _async(
            n, {"policy_loss": "decoupled_ppo", "rollout_correction": {"method": "token_tis"}}
        )
        for n in ASYNC_STALENESS
    },
}
#: The stability view beside each curve: per evaluation, each metric's mean over the steps since the last one
#: (how far behind the samples were, how far their policy was from the trainer's, what the correction and the
#: trust region did, the step size, gradient, entropy and reward, and how many samples the zero-advantage filter
#: kept out of the update), where the run logs it.
STABILITY = (
    "staleness/mean",
    "rollout_corr/kl",
    "rollout_corr/weight_p05",
    "rollout_corr/weight_p95",
    "rollout_corr/truncated_fraction",
    "policy/clip_ratio",
    "policy/ratio_max",
    "policy/lr",
    "policy/grad_norm",
    "policy/entropy",
    "reward/mean",
    "filter/zero_advantage/dropped",
)

TOOL_ENVIRONMENT = {
    "path": str(REPO / "rl_engine" / "environments" / "calculator.py"),
    "name": "Calculator",
    "max_turns": 3,
    "options": {"call_cost": 0.05, "max_calls": 2},
}


def _read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _emit(**record) -> None:
    print(json.dumps(record), flush=True)


# --- when to evaluate, and what the summary reads ---------------------------------------------------


def summary_marks(minutes: float) -> list[float]:
    """Seconds of training the summary reports accuracy at: every whole minute, and the end."""
    return sorted({60.0 * m for m in range(1, math.floor(minutes) + 1)} | {round(60.0 * minutes, 6)})


def evaluation_schedule(budget_s: float, every_s: float, marks: list[float]) -> list[float]:
    """When evaluations are due: 0, every `every_s`, every summary mark, the end."""
    regular = {round(i * every_s, 6) for i in range(int(budget_s // every_s) + 1)} if every_s > 0 else {0.0}
    return sorted(regular | set(marks) | {0.0, budget_s})


class Evaluations:
    """A worker's evaluation clock: which due times a step boundary at `clock` has reached. With a step
    budget (`--steps`) the due "times" are steps: 0, every `every_s` steps, the last."""

    def __init__(self, budget_s: float, every_s: float, minutes: float, steps: int | None = None):
        if steps is None:
            self.due = evaluation_schedule(budget_s, every_s, summary_marks(minutes))
        else:
            self.due = sorted({0.0, float(steps)} | {float(s) for s in range(0, steps, max(1, int(every_s)))})
        self.by_step = steps is not None

    def reached(self, clock: float, step: int = 0) -> list[float]:
        """The due times (steps) passed since the last call: one evaluation serves them all."""
        now = float(step) if self.by_step else clock
        passed = [d for d in self.due if d <= now + 1e-9]
        self.due = self.due[len(passed) :]
        return passed

    @property
    def done(self) -> bool:
        return not self.due


def accuracy_at(curve: list[dict], seconds: float) -> float | None:
    """The accuracy of the evaluation due at `seconds` of training (None if the run ended before)."""
    return next((p["accuracy"] for p in curve if abs(p["due_s"] - seconds) < 1e-6), None)


def time_to(curve: list[dict], target: float) -> float | None:
    """Training seconds at the first evaluation that reached `target`."""
    return next((p["train_s"] for p in curve if p["accuracy"] >= target), None)


def held_from(curve: list[dict], target: float) -> float | None:
    """The due time from which every later evaluation stayed at or above `target` (None: the last did not)."""
    held = None
    for point in reversed(curve):
        if point["accuracy"] < target:
            break
        held = point["due_s"]
    return held


# --- workers (one process per system and seed) -------------------------------------------------


def policy_for_evaluation(engine: Any) -> Any:
    """The policy as the trainer has it now: the engine's own module in one process, else a local copy
    loaded from the weights the trainer ranks write for a sync (with Ray roles the driver holds none)."""
    if engine.model is not None:
        return engine.model
    from safetensors.torch import load_file

    from rl_engine.components import load_policy

    if not hasattr(engine, "bench_policy"):
        engine.bench_policy = load_policy(engine.cfg.model.path, engine.cfg).eval()
    path = engine.roles.call([a.role for a in engine.roles.ranks], "write_weights_file")[engine.roles.ranks[0].role]
    try:
        engine.bench_policy.load_state_dict(load_file(path), strict=True)
    finally:
        os.unlink(path)
    return engine.bench_policy


def worker_ours(
    config_path: Path,
    seed: int,
    budget_s: float,
    every_s: float,
    minutes: float,
    eval_rows,
    tool: bool,
    steps: int | None = None,
):
    import torch

    from rl_engine.config import load_config
    from rl_engine.demo.evaluate import evaluate_greedy
    from rl_engine.loop import build_engine, evaluate, run_step

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    recipe = load_config(config_path)
    # The bench's own mechanics on top of the recipe: its seed, its step budget (`--steps`, which is then also the
    # horizon of a decaying learning-rate schedule; else none, and the clock ends the run), evaluations by this
    # worker's schedule, no checkpoints.
    mechanics = {
        "seed": seed,
        "train": recipe.train.model_copy(update={"steps": steps or 100_000}),
        "logging": recipe.logging.model_copy(update={"eval_every": 0}),
        "checkpoint": recipe.checkpoint.model_copy(update={"save_final": False, "every_steps": 0}),
    }
    cfg = recipe.model_copy(update=mechanics)
    engine = build_engine(cfg)
    evaluations = Evaluations(budget_s, every_s, minutes, steps)
    samples_per_step = cfg.samples_per_step
    clock, step = 0.0, 0
    since_eval: dict[str, list[float]] = {}
    while True:
        due = evaluations.reached(clock, step)
        if due:
            # Async: the batches generated ahead finish on the clock, so no generation runs free while the
            # clock is paused for the evaluation.
            started = time.perf_counter()
            drain_generation_ahead(engine)
            clock += time.perf_counter() - started
            extra = {}
            if tool:  # episodes with the calculator available, greedy: the environment judges the answer
                result = evaluate(engine, engine.data.eval[: len(eval_rows)], 6)
                accuracy, extra = result["eval/env/correct"], {"calls_per_episode": result["eval/env/calls"]}
            else:
                accuracy = evaluate_greedy(policy_for_evaluation(engine), engine.tokenizer, eval_rows)
            stability = {name: round(statistics.fmean(values), 6) for name, values in since_eval.items() if values}
            since_eval = {}
            for due_s in due:
                _emit(
                    due_s=due_s,
                    train_s=round(clock, 3),
                    step=step,
                    samples=step * samples_per_step,
                    accuracy=accuracy,
                    **extra,
                    **({"stability": stability} if stability else {}),
                )
        if evaluations.done:
            break
        started = time.perf_counter()
        step += 1
        metrics, _ = run_step(engine, step)
        clock += time.perf_counter() - started
        for name in STABILITY:
            if name in metrics:
                since_eval.setdefault(name, []).append(metrics[name])
    engine.close()


def drain_generation_ahead(engine: Any) -> None:
    """Waits for the batches async mode generates ahead (none in sync mode)."""
    for pending in engine.pending:
        pending.finish(engine.rollout)


def trl_recipe(demo: Path, trl_sets: list[str]) -> dict[str, Any]:
    """TRL GRPOTrainer's arguments matching the demo recipe (`--trl-set lr=...` changes the learning rate)."""
    from rl_engine.demo.run_config import demo_run_config

    extra = dict(item.split("=", 1) for item in trl_sets)
    unknown = set(extra) - {"lr"}
    if unknown:
        raise SystemExit(f"--trl-set: only lr is supported, got {sorted(unknown)}")
    # The demo recipe's learning rate and schedule (in a timed run ours decays over 100,000 steps, as TRL does here).
    train = demo_run_config(demo).train
    schedule = "constant_with_warmup" if train.lr_schedule == "constant" and train.warmup_steps else train.lr_schedule
    return {
        "model": str(demo / "model"),
        "train_data": str(demo / "data" / "train.jsonl"),
        "args": {
            "use_cpu": True,
            "report_to": "none",
            "learning_rate": float(extra.get("lr", train.lr)),
            "lr_scheduler_type": schedule,
            "warmup_steps": train.warmup_steps,
            "beta": 0.0,
            "num_generations": 8,
            "per_device_train_batch_size": 256,
            "gradient_accumulation_steps": 1,
            "max_completion_length": 6,
            "temperature": 1.0,
            "max_steps": 100_000,
            "logging_steps": 1_000_000,
            "save_strategy": "no",
            "dataloader_num_workers": 0,
            "bf16": False,
            "disable_tqdm": True,
        },
    }


def worker_trl(recipe_path: Path, seed: int, budget_s: float, every_s: float, minutes: float, eval_rows) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rl_engine.demo.evaluate import evaluate_greedy
    from rl_engine.rewards import ExactMatch, RewardBatch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    recipe = json.loads(recipe_path.read_text())
    tokenizer = AutoTokenizer.from_pretrained(recipe["model"])
    model = AutoModelForCausalLM.from_pretrained(recipe["model"], dtype=torch.float32)
    train = Dataset.from_list(_read_rows(Path(recipe["train_data"])))
    judge = ExactMatch()

    def correct(prompts, completions, label, **_):
        return judge.score(RewardBatch.build(prompts, completions, label)).scores

    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl-grpo-"), seed=seed, **recipe["args"])

    class Clock(TrainerCallback):
        def __init__(self):
            self.clock, self.started = 0.0, 0.0
            self.evaluations = Evaluations(budget_s, every_s, minutes)

        def evaluate(self, step: int) -> None:
            due = self.evaluations.reached(self.clock)
            if due:
                accuracy = evaluate_greedy(model, tokenizer, eval_rows)
                for due_s in due:
                    _emit(due_s=due_s, train_s=round(self.clock, 3), step=step, accuracy=accuracy)

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 0:
                self.evaluate(0)
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.clock += time.perf_counter() - self.started
            self.evaluate(state.global_step)
            if self.evaluations.done:
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


def write_recipe(out: Path, label: str, demo: Path, overrides: dict[str, Any], sets: list[str]) -> Path:
    """The recipe's whole run config (absolute paths), as `python -m rl_engine train` reads it."""
    from rl_engine.__main__ import _resolve_paths
    from rl_engine.config import dump_config, validate_config
    from rl_engine.config.overrides import apply_overrides
    from rl_engine.demo.run_config import demo_run_config

    base = demo_run_config(demo, **overrides).model_dump(mode="json")
    base["name"] = f"learning-{label}"
    cfg = _resolve_paths(validate_config(apply_overrides(base, sets)), demo)
    path = out / "recipes" / f"{label}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_config(cfg))
    return path


def run_worker(system: str, recipe: Path, seed: int, minutes: float, args: argparse.Namespace, out: Path) -> dict:
    command = [
        sys.executable,
        __file__,
        "--worker",
        system,
        "--recipe-path",
        str(recipe),
        "--seed",
        str(seed),
        "--minutes",
        str(minutes),
        "--eval-every-s",
        str(args.eval_every_s),
        "--demo-dir",
        str(args.demo_dir),
        "--eval-size",
        str(args.eval_size),
        *(["--steps", str(args.steps), "--eval-every-steps", str(args.eval_every_steps)] if args.steps else []),
    ]
    label = recipe.stem
    stderr = out / "logs" / f"{label}-{system}-seed{seed}.log"
    stderr.parent.mkdir(parents=True, exist_ok=True)
    started, load_at_start = time.monotonic(), load_average()
    with stderr.open("w") as errors:
        process = _servers.child(command, stdout=subprocess.PIPE, stderr=errors, text=True)
    output = ""
    for line in process.stdout:  # echoed as it comes, so a long bench shows progress and leaves a trace
        output += line
        if _curve_point(line) is not None:
            print(f"{label} seed {seed}: {line.strip()}", file=sys.stderr, flush=True)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    curve = [point for line in output.splitlines() if (point := _curve_point(line)) is not None]
    if process.returncode != 0 or not curve:
        raise _servers.ProcessFailed(
            f"{label} ({system}) seed {seed} failed (exit {process.returncode}"
            + ("" if curve else ", no evaluation")
            + f"); the end of its stderr ({stderr}):\n{_servers.log_tail(stderr)}"
        )
    return {
        "seed": seed,
        "curve": curve,
        "steps": curve[-1]["step"],
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "process_wall_s": round(time.monotonic() - started, 1),
        "loadavg_start": load_at_start,
        "loadavg_end": load_average(),
    }


def _curve_point(line: str) -> dict | None:
    """A worker's evaluation line; anything else it prints (TRL's own summary dict) is not one."""
    try:
        point = json.loads(line)
    except ValueError:
        return None
    return point if isinstance(point, dict) and "accuracy" in point and "due_s" in point else None


def _median_or_none(values: list[float | None]) -> float | None:
    """The median when every seed has a value, else None (a seed that never got there)."""
    return statistics.median(values) if values and all(v is not None for v in values) else None


def summarize(results: dict[str, list[dict]], minutes: float) -> dict:
    marks = summary_marks(minutes)
    summary: dict[str, Any] = {}
    for system, runs in results.items():
        per_mark = {}
        for mark in marks:
            seen = [a for r in runs if (a := accuracy_at(r["curve"], mark)) is not None]
            per_mark[f"accuracy_at_{mark / 60:g}min"] = statistics.median(seen) if seen else None
        summary[system] = {
            **per_mark,
            "time_to_90pct_s": _median_or_none([time_to(r["curve"], 0.9) for r in runs]),
            # The latest seed: "held from" holds only when it holds for every seed.
            "held_90pct_from_s": max(h)
            if (h := [held_from(r["curve"], 0.9) for r in runs]) and None not in h
            else None,
            "steps_median": statistics.median(r["steps"] for r in runs),
            "peak_rss_mib_max": max(r["peak_rss_mib"] for r in runs),
        }
    final = f"accuracy_at_{marks[-1] / 60:g}min"
    trl_final = summary.get("trl", {}).get(final)
    if trl_final is not None:
        for system, runs in results.items():
            if system in ("trl", "tool"):
                continue
            reached = _median_or_none([time_to(r["curve"], trl_final) for r in runs])
            summary[system]["time_to_trl_final_accuracy_s"] = reached
            summary[system]["time_to_trl_final_ratio"] = round(reached / marks[-1], 3) if reached is not None else None
    if "tool" in results and "default" in results:
        summary["tool_minus_single_turn_final_accuracy"] = round(summary["tool"][final] - summary["default"][final], 4)
    return summary


def summarize_by_samples(results: dict[str, list[dict]]) -> dict:
    """With a step budget (`--steps`): per system the median accuracy at each evaluated sample count (every
    system has trained on as many samples there) and the median training seconds it took to get there."""
    summary: dict[str, Any] = {}
    for system, runs in results.items():
        marks = sorted({p["samples"] for r in runs for p in r["curve"]})
        entry: dict[str, Any] = {}
        for mark in marks:
            points = [next((p for p in r["curve"] if p["samples"] == mark), None) for r in runs]
            if any(p is None for p in points):
                continue
            entry[f"accuracy_at_{mark}_samples"] = statistics.median(p["accuracy"] for p in points)
            entry[f"train_s_at_{mark}_samples"] = round(statistics.median(p["train_s"] for p in points), 1)
        entry["peak_rss_mib_max"] = max(r["peak_rss_mib"] for r in runs)
        summary[system] = entry
    return summary


def search_candidates(losses: list[str], lrs: list[float], prompts: list[int]) -> dict[str, dict[str, Any]]:
    """The grid `--search` screens: every policy loss x learning rate x prompts per step (8 samples each)."""
    candidates = {}
    for loss, lr, per_step in itertools.product(losses, lrs, prompts):
        algorithm = {"policy_loss": loss} if loss == "ppo_clip" else {"policy_loss": loss, **OWN_CLIPS}
        candidates[f"{loss}-lr{lr:g}-p{per_step}"] = {
            "algorithm": algorithm,
            "rollout": {"prompts_per_step": per_step},
            "train": {"lr": lr, "micro_batch_size": min(256, per_step * 8)},
        }
    return candidates


def run_systems(labels: dict[str, Path], args: argparse.Namespace, out: Path, trl: Path) -> dict[str, list[dict]]:
    """Every seed of our recipes (`labels`), the tool recipe and TRL, as `--systems` asks."""
    results: dict[str, list[dict]] = {}
    if "ours" in args.systems:
        for label, recipe in labels.items():
            results[label] = [run_worker("ours", recipe, seed, args.minutes, args, out) for seed in args.seeds]
    if "tool" in args.systems:
        tool = write_recipe(out, "tool", args.demo_dir, {"environment": TOOL_ENVIRONMENT, "rewards": []}, args.set)
        results["tool"] = [run_worker("tool", tool, seed, args.minutes, args, out) for seed in args.seeds]
    if "trl" in args.systems:
        results["trl"] = [run_worker("trl", trl, seed, args.minutes, args, out) for seed in args.seeds]
    return results


def ensure_demo(demo_dir: Path, size: str) -> dict[str, Any]:
    """The demo task in `demo_dir`, built if missing; its manifest. `tiny` is for smoke tests only."""
    from rl_engine.demo.build import build_demo, existing_build
    from rl_engine.demo.run_config import build_demo_assets

    if size == "demo":
        build_demo_assets(demo_dir)
    elif (existing_build(demo_dir) or {}).get("model_size") != size:
        build_demo(demo_dir, seed=0, model_size=size, progress=False)
    return json.loads((demo_dir / "manifest.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--systems", nargs="+", default=["ours", "trl"], choices=["ours", "trl", "tool"])
    parser.add_argument("--recipes", nargs="+", default=["default"], choices=sorted(RECIPES))
    parser.add_argument("--recipe-file", type=Path, action="append", default=[], help="a recipe YAML this bench wrote")
    parser.add_argument("--demo-dir", type=Path, default=REPO / ".demo" / "assets")
    parser.add_argument("--demo-size", choices=["demo", "tiny"], default="demo", help="tiny: smoke tests only")
    parser.add_argument("--out", type=Path, default=None, help="default: .bench-results/learning-<time>")
    parser.add_argument("--eval-every-s", type=float, default=30.0)
    parser.add_argument(
        "--steps", type=int, default=None, help="a step budget instead of --minutes: every system, equal samples"
    )
    parser.add_argument("--eval-every-steps", type=int, default=5, help="with --steps: evaluate every N steps")
    parser.add_argument("--eval-size", type=int, default=1000, help="held-out prompts per evaluation (>= 500: noise)")
    parser.add_argument("--set", action="append", default=[], help="override our run configs, e.g. train.lr=1e-3")
    parser.add_argument("--trl-set", action="append", default=[], help="TRL option, e.g. lr=1e-4")
    parser.add_argument("--search", action="store_true", help="screen a grid of recipes, then run the best")
    parser.add_argument("--screen-minutes", type=float, default=3.0)
    parser.add_argument("--top", type=int, default=2)
    parser.add_argument("--search-losses", nargs="+", default=["ppo_clip", "gspo", "cispo", "gmpo"])
    parser.add_argument("--search-lr", type=float, nargs="+", default=[1e-4, 2e-4, 4e-4])
    parser.add_argument("--search-prompts", type=int, nargs="+", default=[32, 16])
    parser.add_argument("--worker", choices=["ours", "trl", "tool"], help=argparse.SUPPRESS)
    parser.add_argument("--recipe-path", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        eval_rows = _read_rows(args.demo_dir / "data" / "test.jsonl")[: args.eval_size]
        timing = (round(args.minutes * 60, 6), args.eval_every_s, args.minutes)
        if args.worker == "trl":
            worker_trl(args.recipe_path, args.seed, *timing, eval_rows)
        else:
            every = args.eval_every_steps if args.steps else args.eval_every_s
            worker_ours(
                args.recipe_path,
                args.seed,
                timing[0],
                every,
                args.minutes,
                eval_rows,
                tool=args.worker == "tool",
                steps=args.steps,
            )
        return
    if args.steps and set(args.systems) != {"ours"}:
        parser.error("--steps runs our recipes only (--systems ours): TRL's and the tool's workers run by the clock")

    machine = MachineLoad()
    manifest = ensure_demo(args.demo_dir, args.demo_size)
    out = args.out or REPO / ".bench-results" / time.strftime("learning-%Y%m%d-%H%M%S")
    trl = out / "recipes" / "trl.json"
    trl.parent.mkdir(parents=True, exist_ok=True)
    trl.write_text(json.dumps(trl_recipe(args.demo_dir, args.trl_set), indent=1))

    labels = {name: write_recipe(out, name, args.demo_dir, RECIPES[name], args.set) for name in args.recipes}
    for path in args.recipe_file:
        labels[path.stem] = path
    document: dict[str, Any] = {}
    if args.search:
        candidates = search_candidates(args.search_losses, args.search_lr, args.search_prompts)
        screens = {}
        for label, overrides in candidates.items():
            recipe = write_recipe(out, label, args.demo_dir, overrides, args.set)
            run = run_worker("ours", recipe, args.seeds[0], args.screen_minutes, args, out)
            marks = summary_marks(args.screen_minutes)
            screens[label] = {
                "final_accuracy": accuracy_at(run["curve"], marks[-1]),
                "mean_accuracy": statistics.fmean(p["accuracy"] for p in run["curve"]),
                "steps": run["steps"],
                "recipe": str(recipe),
            }
        ranked = sorted(
            screens, key=lambda k: (screens[k]["final_accuracy"] or 0, screens[k]["mean_accuracy"]), reverse=True
        )
        document["search"] = {
            "screen_minutes": args.screen_minutes,
            "seed": args.seeds[0],
            "ranked": ranked,
            "screens": screens,
        }
        labels = {label: out / "recipes" / f"{label}.yaml" for label in ranked[: args.top]} | labels
    results = run_systems(labels, args, out, trl)
    document = {
        "bench": "learning",
        "minutes": args.minutes,
        "seeds": args.seeds,
        "threads": os.environ["OMP_NUM_THREADS"],
        "warm_start_accuracy": manifest.get("warm_start", {}).get("test_accuracy"),
        "recipes": {label: str(path) for label, path in labels.items()} | {"trl": str(trl)},
        "overrides": {"ours": args.set, "trl": args.trl_set},
        **document,
        "summary": summarize_by_samples(results) if args.steps else summarize(results, args.minutes),
        "runs": results,
        "machine": machine.report(),
    }
    text = json.dumps(document, indent=1)
    (out / "results.json").write_text(text)
    print(text)


if __name__ == "__main__":
    _servers.run_bench(main)
