"""Sandbox cost: a python reward in the bubblewrap sandbox against the unsandboxed child (what every
python reward ran in before), on the demo reward and on a verl-shaped reward.

    .venv/bin/python bench/sandbox.py [--starts 30] [--batches 100] [--batch-size 256] [--learning-steps 40] \
        [--demo-dir .demo/assets]

- **Rewards.** `demo`: the demo task's exact match as an OpenRLHF `reward_func` (one call per batch).
  `verl`: a verl `compute_score` that pulls the last number out of the response (gsm8k-style), called
  once per sample, so a batch is 256 round trips through the child's pipes.
- **Kernel limits.** The sandboxed mode runs as the engine does: in a cgroup of its own (memory, pids,
  cpu), under the seccomp filter, with a fresh session keyring, all joined by the launcher; after each
  batch the processes a call left are looked for and killed. `machine.kernel_limits` says which of them
  were on (and `warnings` which could not be made here); the unsandboxed mode gets the cgroup too.
- **Start-up.** Time from constructing the component to the child's "ready" (the launcher, the sandbox
  built, the interpreter started, the file imported), then closed; `--starts` times per mode, the modes
  alternating.
- **Per batch.** One warm child per mode; `--batches` batches of `--batch-size` samples, the two modes
  taking turns on the same batch; the scores must be identical.
- **Unsandboxed.** The admin's override (POSTTRAIN_ALLOW_UNSANDBOXED_CODE=1 with no bubblewrap): the
  same child process the sandbox starts, as a plain subprocess (plus one `prlimit` exec).
- **Learning curve.** `--learning-steps` steps of the demo run (the model in `--demo-dir`, the demo built
  there if it has none) three times: with its built-in exact_match, with the python demo reward sandboxed, and
  unsandboxed; `reward/mean` must be the same at every step (each in its own process).

Prints one JSON document: medians and 90th percentiles in milliseconds, the added cost per start and
per batch, and whether the goals hold (start <= 150 ms, <= 10 ms added per batch, same curve).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers
from bench._machine import MachineLoad
from bench._servers import REPO

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEMO_REWARD = """
def reward_func(queries, prompts, labels, **kwargs):
    responses = kwargs["responses"]
    return [1.0 if label is not None and response.strip() == label.strip() else 0.0
            for response, label in zip(responses, labels)]
"""
VERL_REWARD = """
import re

_NUMBER = re.compile(r"-?\\d+(?:\\.\\d+)?")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    numbers = _NUMBER.findall(solution_str.replace(",", ""))
    if not numbers:
        return {"score": 0.0, "format_ok": 0.0}
    return {"score": float(numbers[-1] == str(ground_truth).strip()), "format_ok": 1.0}
"""
START_GOAL_MS = 150.0
BATCH_GOAL_MS = 10.0


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def set_mode(sandboxed: bool) -> None:
    """Sandboxed: bubblewrap as installed. Unsandboxed: no bubblewrap, the admin's override on."""
    from rl_engine import sandbox

    if sandboxed:
        os.environ.pop(sandbox.BWRAP_ENV, None)
        os.environ.pop(sandbox.ALLOW_UNSANDBOXED_ENV, None)
    else:
        os.environ[sandbox.BWRAP_ENV] = "/nonexistent/bwrap"
        os.environ[sandbox.ALLOW_UNSANDBOXED_ENV] = "1"
    assert sandbox.require() is sandboxed


def make_batch(size: int, seed: int = 0):
    """Two-digit additions, as the demo task asks them; about half the responses right."""
    from rl_engine.rewards import RewardBatch

    rng = random.Random(seed)
    prompts, responses, labels = [], [], []
    for _ in range(size):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        prompts.append(f"{a}+{b}=")
        labels.append(str(a + b))
        responses.append(str(a + b if rng.random() < 0.5 else a + b + rng.randint(1, 9)))
    return RewardBatch.build(prompts, responses, labels)


def stats(values_s: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values_s)
    return {
        "median_ms": round(statistics.median(ms), 3),
        "p90_ms": round(ms[min(len(ms) - 1, int(0.9 * len(ms)))], 3),
        "min_ms": round(ms[0], 3),
        "n": len(ms),
    }


def bench_reward(path: Path, starts: int, batches: int, batch_size: int) -> dict:
    from rl_engine.rewards import PythonFunctionReward

    start_times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(starts):
        for sandboxed in (True, False) if i % 2 == 0 else (False, True):
            set_mode(sandboxed)
            began = time.perf_counter()
            component = PythonFunctionReward(str(path))
            component.start()
            start_times[sandboxed].append(time.perf_counter() - began)
            component.close()

    batch = make_batch(batch_size)
    components = {}
    for sandboxed in (True, False):
        set_mode(sandboxed)
        components[sandboxed] = PythonFunctionReward(str(path))
        for _ in range(3):  # warm: the child started, its first calls made
            components[sandboxed].score(batch)
    batch_times: dict[bool, list[float]] = {True: [], False: []}
    results = {}
    for i in range(batches):
        for sandboxed in (True, False) if i % 2 == 0 else (False, True):
            began = time.perf_counter()
            results[sandboxed] = components[sandboxed].score(batch)
            batch_times[sandboxed].append(time.perf_counter() - began)
        if results[True].scores != results[False].scores or any(results[True].errors):
            raise SystemExit(f"{path.name}: the two modes scored differently: {results[True].errors[:3]}")
    for component in components.values():
        component.close()

    out = {
        mode: {"start": stats(start_times[flag]), "batch": stats(batch_times[flag])}
        for mode, flag in (("sandboxed", True), ("unsandboxed", False))
    }
    out["added_start_ms"] = round(out["sandboxed"]["start"]["median_ms"] - out["unsandboxed"]["start"]["median_ms"], 3)
    out["added_batch_ms"] = round(out["sandboxed"]["batch"]["median_ms"] - out["unsandboxed"]["batch"]["median_ms"], 3)
    out["mean_score"] = round(statistics.fmean(results[True].scores), 4)
    return out


# --- the demo run's learning curve -------------------------------------------------------------


def worker_learning(demo: Path, steps: int, reward: str, reward_file: Path) -> None:
    """One short demo run; prints its reward/mean per step as JSON."""
    import torch

    from rl_engine.__main__ import _resolve_paths
    from rl_engine.demo.run_config import demo_run_config
    from rl_engine.loop import build_engine, run_step

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if reward != "builtin":
        set_mode(reward == "sandboxed")
    rewards = (
        [{"type": "exact_match", "name": "correct"}]
        if reward == "builtin"
        else [{"type": "python", "name": "correct", "path": str(reward_file)}]
    )
    cfg = demo_run_config(
        demo,
        rewards=rewards,
        train={"steps": steps},
        logging={"eval_every": 0},
        checkpoint={"save_final": False, "every_steps": 0},
    )
    engine = build_engine(_resolve_paths(cfg, demo))
    curve = []
    for step in range(1, steps + 1):
        metrics, _ = run_step(engine, step)
        curve.append(metrics["reward/mean"])
    engine.close()
    print(json.dumps({"reward": reward, "reward_mean": curve}), flush=True)


def learning_curves(demo: Path, steps: int, reward_file: Path) -> dict:
    from rl_engine.demo.run_config import build_demo_assets

    if not (demo / "model").is_dir():
        build_demo_assets(demo)
    curves = {}
    for reward in ("builtin", "sandboxed", "unsandboxed"):
        _log(f"learning curve: {steps} demo steps with the {reward} reward")
        proc = _servers.run_checked(
            [
                sys.executable,
                __file__,
                "--worker-learning",
                reward,
                "--demo-dir",
                str(demo),
                "--learning-steps",
                str(steps),
                "--reward-file",
                str(reward_file),
            ],
            f"the {reward} demo run",
        )
        curves[reward] = json.loads(proc.stdout.strip().splitlines()[-1])["reward_mean"]
    same = curves["builtin"] == curves["sandboxed"] == curves["unsandboxed"]
    return {"steps": steps, "same_curve": same, "reward_mean": curves}


def host() -> dict:
    from rl_engine import sandbox

    set_mode(True)
    return {
        "python": platform.python_version(),
        "bubblewrap": sandbox.status().detail,
        "kernel_limits": sandbox.status().limits,
        "warnings": list(sandbox.status().warnings),
        "as_root": os.geteuid() == 0,  # the sandbox then maps its user to nobody (one more exec: setpriv)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=30)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--learning-steps", type=int, default=40, help="0 skips the learning-curve check")
    parser.add_argument("--demo-dir", type=Path, default=REPO / ".demo" / "assets")
    parser.add_argument("--worker-learning", choices=["builtin", "sandboxed", "unsandboxed"], help=argparse.SUPPRESS)
    parser.add_argument("--reward-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_learning:
        worker_learning(args.demo_dir, args.learning_steps, args.worker_learning, args.reward_file)
        return

    machine = MachineLoad()
    report: dict = {"bench": "sandbox", "batch_size": args.batch_size, "rewards": {}}
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as folder:
        files = {"demo": Path(folder) / "demo_reward.py", "verl": Path(folder) / "verl_reward.py"}
        files["demo"].write_text(DEMO_REWARD)
        files["verl"].write_text(VERL_REWARD)
        for name, path in files.items():
            _log(f"{name} reward: {args.starts} starts and {args.batches} batches per mode")
            report["rewards"][name] = bench_reward(path, args.starts, args.batches, args.batch_size)
        if args.learning_steps > 0:
            report["learning"] = learning_curves(args.demo_dir, args.learning_steps, files["demo"])
    rewards = report["rewards"].values()
    report["goals"] = {
        "start_ms_at_most": START_GOAL_MS,
        "start_met": all(r["sandboxed"]["start"]["median_ms"] <= START_GOAL_MS for r in rewards),
        "added_batch_ms_at_most": BATCH_GOAL_MS,
        "added_batch_met": all(r["added_batch_ms"] <= BATCH_GOAL_MS for r in rewards),
        "same_learning_curve": report.get("learning", {}).get("same_curve"),
    }
    report["machine"] = machine.report(**host())
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    _servers.run_bench(main)
