"""Resume without loss: SIGKILL the engine at random moments of a 2-epoch run, resume it each time from its
latest checkpoint, and check its prompt ledger (rl_engine/ledger.py) against an unkilled run's.

Per mode (`sync`; `async1`, `async4`: generation up to 1 or 4 updates ahead on a rollout actor of its own;
`async4_partial`: the same with partial rollout), on the demo model and the first `--rows` rows of its training
set, `--epochs` epochs exactly: one run straight through, then one killed `--kills` times. Each kill lands a
random number of steps (1 to `--checkpoint-every` + 1) past where that attempt resumed plus a random part of
a step's time, so kills fall in generation, training, checkpoint writes and resumes alike. The whole process
group is killed (SIGKILL; in async mode the local Ray cluster goes with it), and the next attempt is
`python -m rl_engine train --resume auto` in the same run folder.

Reports per mode: rows skipped, trained twice, still in flight, dropped, and staleness-bound violations per
epoch (all must be 0); whether the set of (epoch, row) that got a fate, and the set trained, equal the
unkilled run's; and what the resumes cost (seconds from process start to the first step, steps and rows
re-done). Prints one JSON document (also OUT/results.json) with the machine's load.

    .venv/bin/python bench/ledger_faults.py [--modes sync async1 async4 async4_partial] [--kills 10] [--rows 48]
        [--epochs 2] [--prompts-per-step 4] [--checkpoint-every 2] [--seed 0] [--out DIR] [--demo-dir .demo/assets]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers
from bench._machine import MachineLoad
from bench._servers import REPO

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MODES: dict[str, dict[str, Any]] = {
    "sync": {},
    "async1": {"placement": {"mode": "separate"}, "backends": {"async_rollout": True, "max_staleness": 1}},
    "async4": {"placement": {"mode": "separate"}, "backends": {"async_rollout": True, "max_staleness": 4}},
    "async4_partial": {
        "placement": {"mode": "separate"},
        "backends": {"async_rollout": True, "max_staleness": 4, "partial_rollout": True, "partial_rollout_tokens": 2},
    },
}


def run_config(demo: Path, data: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    steps = args.epochs * args.rows // args.prompts_per_step
    return {
        "name": f"ledger-{mode}",
        "seed": args.seed,
        "model": {"path": str(demo / "model")},
        "data": {"path": str(data)},
        "rewards": [
            {"type": "exact_match"},
            {"type": "regex", "name": "two_digits", "pattern": r"^\d\d", "weight": 0.5},
        ],
        "algorithm": {"name": "grpo"},
        "rollout": {
            "prompts_per_step": args.prompts_per_step,
            "samples_per_prompt": 4,
            "max_new_tokens": 6,
            "temperature": 1.0,
        },
        "train": {"steps": steps, "lr": 1e-4, "micro_batch_size": 16},
        "checkpoint": {"every_steps": args.checkpoint_every, "keep_last": 2, "save_final": False},
        "logging": {"eval_every": 0, "heartbeat_s": 60},
        **MODES[mode],
    }


def metrics_steps_since(run_dir: Path, offset: int) -> list[int]:
    """The steps of the metrics events appended to the run's events file past byte `offset`."""
    events = run_dir / "events.jsonl"
    if not events.exists():
        return []
    with events.open("rb") as f:
        f.seek(offset)
        lines = f.read().splitlines()
    steps = []
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:  # a line torn by the kill
            continue
        if event.get("type") == "metrics":
            steps.append(int(event.get("step") or 0))
    return steps


def events_size(run_dir: Path) -> int:
    events = run_dir / "events.jsonl"
    return events.stat().st_size if events.exists() else 0


def checkpoint_step(run_dir: Path) -> int:
    from rl_engine.spec.checkpoints import checkpoint_step as step_of
    from rl_engine.spec.checkpoints import latest_checkpoint

    return step_of(latest_checkpoint(run_dir)) or 0


def start_attempt(config: Path, run_dir: Path, resume: bool, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "rl_engine", "train", str(config), "--run-dir", str(run_dir), "--no-progress"]
    if resume:
        command += ["--resume", "auto"]
    # Its own process group: a kill takes the engine and whatever it started (a local Ray cluster) at once.
    return _servers.child(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log.open("a"), start_new_session=True)


def kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the group's other members (Ray's) die with it; wait until they have
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def run_straight(config: Path, run_dir: Path, log: Path) -> float:
    started = time.monotonic()
    process = start_attempt(config, run_dir, False, log)
    if process.wait() != 0:
        raise _servers.ProcessFailed(f"the unkilled run failed:\n{_servers.log_tail(log)}")
    return time.monotonic() - started


def run_killed(
    config: Path, run_dir: Path, log: Path, steps: int, args: argparse.Namespace, rng: random.Random
) -> dict:
    """The run of `steps` steps, killed up to `args.kills` times and resumed each time; the kills' moments. Each
    kill lands 1 to `checkpoint_every` + 1 steps past the checkpoint the attempt resumed from, plus a random part
    of a step, never after the last step: an attempt that resumed past `steps - 2` is left to finish."""
    kills: list[dict[str, Any]] = []
    step_s: list[float] = []
    started = time.monotonic()
    while True:
        resumed_at = checkpoint_step(run_dir)
        offset = events_size(run_dir)
        process = start_attempt(config, run_dir, resume=resumed_at > 0, log=log)
        attempt_started = time.monotonic()
        if len(kills) >= args.kills or resumed_at >= steps - 1:
            if process.wait() != 0:
                raise _servers.ProcessFailed(f"the last attempt failed:\n{_servers.log_tail(log)}")
            return {"kills": kills, "wall_s": round(time.monotonic() - started, 1)}
        target = min(resumed_at + rng.randint(1, args.checkpoint_every + 1), steps - 1)
        first_step_at = None
        while process.poll() is None:
            done = metrics_steps_since(run_dir, offset)
            if done and first_step_at is None:
                first_step_at = time.monotonic()
            if done and max(done) >= target:
                if len(done) > 1:
                    step_s.append((time.monotonic() - first_step_at) / (len(done) - 1))
                break
            time.sleep(0.02)
        if process.poll() is not None:
            raise _servers.ProcessFailed(f"an attempt ended before its kill:\n{_servers.log_tail(log)}")
        delay = rng.uniform(0, 1.5 * (statistics.median(step_s) if step_s else 1.0))
        time.sleep(delay)
        kill_group(process)
        done = metrics_steps_since(run_dir, offset)
        kills.append(
            {
                "resumed_from": resumed_at,
                "after_step": max(done, default=resumed_at),
                "delay_s": round(delay, 3),
                "attempt_s": round(time.monotonic() - attempt_started, 1),
                # the process's start (imports, engine, checkpoint) to its first step's metrics
                "first_step_s": round((first_step_at or time.monotonic()) - attempt_started, 1),
            }
        )
        _servers.log(f"killed after step {kills[-1]['after_step']} (+{delay:.2f}s); {len(kills)}/{args.kills}")


def compare(reference_dir: Path, killed_dir: Path, max_staleness: int) -> dict[str, Any]:
    from rl_engine.ledger import LEDGER_FILE, read_parquet

    reference, killed = read_parquet(reference_dir / LEDGER_FILE), read_parquet(killed_dir / LEDGER_FILE)
    epochs = killed.summary()

    def total(key: str) -> int:
        return sum(e[key] if isinstance(e[key], int) else sum(e[key].values()) for e in epochs)

    resolved = {k for k, e in killed.entries.items() if e.fate != "in_flight"}
    reference_resolved = {k for k, e in reference.entries.items() if e.fate != "in_flight"}
    resumes = killed.resumes
    return {
        "epochs": epochs,
        "skipped": total("skipped"),
        "trained_twice": total("duplicates"),
        "in_flight_at_end": total("in_flight"),
        "not_drawn_at_end": total("not_drawn"),
        "dropped": total("dropped"),
        "staleness_violations": killed.staleness_violations(max_staleness),
        "resolved_equals_unkilled": resolved == reference_resolved,
        "trained_equals_unkilled": killed.trained_keys() == reference.trained_keys(),
        "trained_differs_by": len(killed.trained_keys() ^ reference.trained_keys()),
        "trained": len(killed.trained_keys()),
        "trained_unkilled": len(reference.trained_keys()),
        "resumes": len(resumes),
        "resume_seconds_median": statistics.median(r.seconds for r in resumes) if resumes else None,
        "resume_seconds_max": max((r.seconds for r in resumes), default=None),
        "redone_steps_total": sum(len(r.redone_steps) for r in resumes),
        "redone_rows_total": sum(r.redone_rows for r in resumes),
        "restored_in_flight_total": sum(r.restored_in_flight for r in resumes),
        "lost_in_flight_total": sum(r.lost_in_flight for r in resumes),
    }


def lossless(result: dict[str, Any]) -> bool:
    keys = ("skipped", "trained_twice", "in_flight_at_end", "not_drawn_at_end", "dropped", "staleness_violations")
    return all(result[k] == 0 for k in keys) and result["resolved_equals_unkilled"]


def main() -> int:
    from rl_engine.demo.build import existing_build
    from rl_engine.demo.run_config import build_demo_assets

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--rows", type=int, default=48, help="training rows (the first of the demo's training set)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="where the runs go (default: a temporary folder)")
    parser.add_argument(
        "--demo-dir", type=Path, default=REPO / ".demo" / "assets", help="the demo build (made there if missing)"
    )
    args = parser.parse_args()
    if args.rows % args.prompts_per_step:
        parser.error("--rows must be a multiple of --prompts-per-step (whole epochs)")
    load = MachineLoad()
    out = args.out or Path(tempfile.mkdtemp(prefix="ledger-faults-"))
    out.mkdir(parents=True, exist_ok=True)
    if existing_build(args.demo_dir) is None:
        build_demo_assets(args.demo_dir)
    data = out / "train.jsonl"
    rows = (args.demo_dir / "data" / "train.jsonl").read_text().splitlines()[: args.rows]
    data.write_text("\n".join(rows) + "\n")
    import yaml

    rng = random.Random(args.seed)
    results: dict[str, Any] = {}
    for mode in args.modes:
        folder = out / mode
        folder.mkdir(exist_ok=True)
        cfg = run_config(args.demo_dir, data, mode, args)
        config = folder / "config.yaml"
        config.write_text(yaml.safe_dump(cfg))
        _servers.log(f"{mode}: the unkilled run")
        straight_s = run_straight(config, folder / "unkilled", folder / "unkilled.log")
        _servers.log(f"{mode}: the run killed {args.kills} times")
        killed = run_killed(config, folder / "killed", folder / "killed.log", cfg["train"]["steps"], args, rng)
        max_staleness = cfg.get("backends", {}).get("max_staleness", 1) if "backends" in cfg else 0
        result = compare(folder / "unkilled", folder / "killed", max_staleness)
        result.update(killed, unkilled_wall_s=round(straight_s, 1))
        firsts = [k["first_step_s"] for k in killed["kills"] if k["resumed_from"] > 0]
        result["resumed_first_step_s_median"] = statistics.median(firsts) if firsts else None
        result["lossless"] = lossless(result)
        results[mode] = result
        _servers.log(f"{mode}: lossless={result['lossless']} trained_equal={result['trained_equals_unkilled']}")
    document = {
        "bench": "ledger_faults",
        "rows": args.rows,
        "epochs": args.epochs,
        "kills": args.kills,
        "modes": results,
        "all_lossless": all(r["lossless"] for r in results.values()),
        "machine": load.report(),
    }
    (out / "results.json").write_text(json.dumps(document, indent=1))
    print(json.dumps(document, indent=1))
    return 0 if document["all_lossless"] else 1


if __name__ == "__main__":
    _servers.run_bench(main)
