"""The scheduler on a mixed job trace: today's in-order admission against backfill, side by side.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/queue_trace.py [--smoke] [--sim-only | --real-only]
        [--runs 16] [--shortest-steps 4] [--sim-runs 1000] [--assets .demo/assets] [--timeout-s 3600]

Two parts, one JSON document on stdout (progress on stderr):

1. **Real stack** (`real`): the demo stack (`scripts/demo.sh`, as bench/queue.py starts it: a temporary
   POSTTRAIN_HOME on free ports, SQLite, a Ray head with `nproc` CPUs: OMP_NUM_THREADS lowers that, so leave it
   unset or at 2 on a 2-core machine) replays a trace of --runs demo
   runs: sizes of 1 or 2 CPUs (`placement.cpus_per_*`), lengths of 1-8x --shortest-steps steps, priorities
   low/normal/high, launched through the REST API at their arrival times. Each (size, length) is its own
   experiment, with a declared limit `train.max_wall_s` from a calibration run (a user's honest estimate:
   1.5x its length alone as the calibration measured it), which the scheduler takes as the run's expected length until
   the run has a pace of its own. The trace is replayed twice on a fresh stack: `POSTTRAIN_SCHEDULER_BACKFILL=0`
   (the first run in order that does not fit holds everyone behind it) and `=1`. Per mode: utilisation of
   the granted CPUs (CPU-seconds granted: the time each run held its grant, from its transitions; over
   capacity x makespan), mean job completion
   time (launch to end), p95 slowdown (completion time over the run's length alone: the calibration run's
   overhead plus its steps at the calibration's median `timing/step`),
   and the runs that started later than without backfill (by more than 15 s, the reconcile's interval).
2. **Simulated cluster** (`simulated`): the same scheduler code (posttrain.scheduling.rules.admission_plan,
   with the platform's preemption) driven by posttrain.scheduling.cluster_sim over 64 GPUs (8 nodes of 8) and
   --sim-runs runs of 1-8 GPUs, lengths 1-8x the shortest, Poisson arrivals at about 90 % load: the same
   figures, and the time of one admission pass with 200 waiting runs on a full cluster (median of 7).

Goals (issue): real stack: utilisation of granted CPUs >= 85 %, mean completion time >= 20 % lower with
backfill, no higher-priority run started later than without it; simulated: a pass <= 50 ms at 200 waiting
runs. Measured on a quiet machine only (the load average is recorded); `--smoke` is a quick look at the
smallest size (4 runs of 1-2 steps, 100 simulated runs), not a measurement.

The stack is started and stopped by `stack()`, the one place to switch to a shared bench server helper.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers
from bench._machine import MachineLoad
from bench.stack_memory import (
    PYTHON,
    REPO,
    TERMINAL,
    BenchError,
    demo_sh,
    line_value,
    manage,
    run_checked,
    stack_env,
)

sys.path[:0] = [str(REPO), str(REPO / "platform")]  # the simulation imports the platform's scheduler

GOAL_UTILISATION = 0.85
GOAL_COMPLETION_DROP = 0.20
GOAL_PASS_S = 0.050
PRIORITIES = ("low", "normal", "high")
MODES = {"in-order": "0", "backfill": "1"}
# How late an admission may come for reasons of its own (a pass missed at a stack's start is made by the next
# reconcile, every 15 s): a run started later than in the other mode by less is not counted as delayed.
ADMISSION_NOISE_S = 15.0


def log(message: str) -> None:
    print(f"[bench queue_trace] {message}", file=sys.stderr, flush=True)


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def at(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


# --- the simulated 64-GPU cluster ------------------------------------------------------------------------


def simulated(runs: int, seed: int) -> dict[str, Any]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "posttrain.settings")
    import django

    django.setup()
    from posttrain.scheduling.cluster_sim import gpu_cluster, mixed_trace, simulate

    nodes = gpu_cluster()
    shortest = 600.0
    mean_size, mean_length = 3.75, 4.5 * shortest  # sizes 1, 2, 4, 8; lengths 1-8x
    gap = mean_size * mean_length / (64 * 0.9)  # about 90 % load
    trace = mixed_trace(runs, seed=seed, shortest_s=shortest, mean_gap_s=gap)
    report: dict[str, Any] = {"cluster": "8 nodes x 8 GPUs", "runs": runs, "mean_gap_s": round(gap, 1)}
    results = {}
    for mode, backfill in (("in-order", False), ("backfill", True)):
        started = time.perf_counter()
        result = simulate(trace, nodes, backfill=backfill, preemption=True)
        results[mode] = result
        passes = sorted(seconds for _, seconds in result.pass_seconds)
        report[mode] = {
            **result.figures("GPU"),
            "preemptions": sum(o.preemptions for o in result.outcomes.values()),
            "passes": len(passes),
            "pass_p50_ms": round(1000 * statistics.median(passes), 2) if passes else None,
            "pass_max_ms": round(1000 * passes[-1], 2) if passes else None,
            "most_waiting": max((n for n, _ in result.pass_seconds), default=0),
            "wall_s": round(time.perf_counter() - started, 1),
        }
        log(f"simulated {mode}: {report[mode]}")
    report["started_later_with_backfill"] = _later(
        {k: (o.run.priority, o.start_s) for k, o in results["backfill"].outcomes.items()},
        {k: (o.run.priority, o.start_s) for k, o in results["in-order"].outcomes.items()},
    )
    report["pass_at_200_waiting_ms"] = _pass_at(200, seed)
    report["comparison"] = _compare(report["in-order"], report["backfill"], "utilisation")
    return report


def _pass_at(waiting: int, seed: int) -> dict[str, Any]:
    """One admission pass over `waiting` runs on the 64-GPU cluster with every GPU held by runs of known
    ends: what the reconcile pays when the queue is long (median and max of 7)."""
    from datetime import UTC, timedelta

    from posttrain.scheduling.cluster_sim import gpu_cluster, mixed_trace
    from posttrain.scheduling.rules import Candidate, FairShare, Plan, admission_plan

    rng = random.Random(seed)
    nodes = gpu_cluster()
    free = {name: {**r, "GPU": 0.0} for name, r in nodes.items()}
    ends = []
    for name in nodes:
        left = 8
        while left:
            size = min(left, rng.choice((1, 2, 4, 8)))
            ends.append((rng.uniform(0, 5000), {name: {"CPU": 0.0, "GPU": float(size)}}))
            left -= size
    now = datetime(2026, 1, 1, tzinfo=UTC)
    candidates = [
        Candidate(r.run_id, r.owner, r.priority, now - timedelta(seconds=i), now, r.need, duration_s=r.length_s)
        for i, r in enumerate(mixed_trace(waiting, seed=seed + 1))
    ]
    total = {"CPU": sum(n["CPU"] for n in nodes.values()), "GPU": 64.0}
    times, cpu = [], []
    for _ in range(7):
        started, started_cpu = time.perf_counter(), time.process_time()
        admission_plan(candidates, Plan(free, total, ends), {}, {}, now, 1800.0, fair=FairShare())
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return {
        "waiting": waiting,
        "running": len(ends),
        "median_ms": round(1000 * statistics.median(times), 2),
        "max_ms": round(1000 * max(times), 2),
        "median_cpu_ms": round(1000 * statistics.median(cpu), 2),  # this process's CPU time: less load-bound
        "goal_ms": GOAL_PASS_S * 1000,
    }


def _later(with_backfill: dict[str, tuple], without: dict[str, tuple], noise_s: float = 0.0) -> dict[str, Any]:
    """Runs that started later with backfill than without it (by more than `noise_s`), by priority, and by
    how much."""
    found: dict[str, list[float]] = {p: [] for p in PRIORITIES}
    for run_id, (priority, start) in with_backfill.items():
        other = without.get(run_id, (priority, None))[1]
        if start is not None and other is not None and start > other + max(noise_s, 1e-6):
            found[priority].append(start - other)
    return {
        p: {"runs": len(v), "max_delay_s": round(max(v), 1) if v else 0.0, "median_delay_s": percentile(v, 0.5)}
        for p, v in found.items()
    }


def _compare(in_order: dict[str, Any], backfill: dict[str, Any], utilisation_key: str) -> dict[str, Any]:
    before, after = in_order.get("mean_completion_s"), backfill.get("mean_completion_s")
    return {
        "mean_completion_drop": round(1 - after / before, 4) if before and after else None,
        "utilisation_in_order": in_order.get(utilisation_key),
        "utilisation_backfill": backfill.get(utilisation_key),
        "p95_slowdown_in_order": in_order.get("p95_slowdown"),
        "p95_slowdown_backfill": backfill.get("p95_slowdown"),
    }


# --- the real stack --------------------------------------------------------------------------------------


class Api:
    """The REST API with a researcher's token (JSON bodies too)."""

    def __init__(self, base: str, token: str):
        self.base, self.token = base, token

    def call(self, path: str, body: dict | None = None, method: str | None = None) -> Any:
        request = urllib.request.Request(
            self.base + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method or ("POST" if body is not None else "GET"),
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)


@contextlib.contextmanager
def stack(env: dict[str, str], home: Path) -> Iterator[None]:
    """The demo stack up for the block, stopped after it whatever happens (a start that failed half-way too)."""
    try:
        if demo_sh(env, "start") != 0:
            raise BenchError(f"scripts/demo.sh start failed; see {home / 'logs'} (--keep-home keeps it)")
        yield
    finally:
        log("stopping the stack")
        demo_sh(env, "stop")


def real_trace(runs: int, shortest_steps: int, seed: int, cpus: int) -> list[dict[str, Any]]:
    """--runs runs: sizes 1-`cpus` CPUs, lengths 1-8x the shortest, mixed priorities, arrivals over time."""
    rng = random.Random(seed)
    trace, arrival = [], 0.0
    for i in range(runs):
        trace.append(
            {
                "index": i,
                "cpus": rng.randint(1, cpus),
                "steps": shortest_steps * rng.randint(1, 8),
                "priority": rng.choices(PRIORITIES, weights=(3, 5, 2))[0],
                "arrival_s": round(arrival, 1),
            }
        )
        arrival += rng.uniform(0.0, 1.0)  # in units of the shortest run's length alone: a busy cluster
    return trace


def wait_until_all_end(api: Api, run_ids: list[str], deadline: float) -> list[dict[str, Any]]:
    last = None
    while True:
        runs = [api.call(f"/api/runs/{run_id}/") for run_id in run_ids]
        progress = " ".join(f"{r['state'][:4]}@{r['last_step'] or 0}" for r in runs)
        if progress != last:
            log(progress)
            last = progress
        if all(r["state"] in TERMINAL for r in runs):
            return runs
        if time.monotonic() > deadline:
            raise BenchError(f"timed out (--timeout-s): {progress}")
        time.sleep(2)


HOLDING = ("starting", "running", "cancelling", "preempting")  # the states in which a run holds its grant


def holding(moves: list[dict[str, Any]]) -> tuple[float | None, float]:
    """From a run's transitions: when it was first admitted, and how long it held its grant in all (a
    preempted run holds nothing while it waits to resume)."""
    first, held, since = None, 0.0, None
    for move in moves:
        when = at(move["at"])
        if move["to_state"] in HOLDING and move["from_state"] not in HOLDING:
            first = when if first is None else first
            since = when
        elif move["from_state"] in HOLDING and move["to_state"] not in HOLDING and since is not None:
            held += when - since
            since = None
    return first, held


def replay(api: Api, trace: list[dict], experiments: dict, unit_s: float, deadline: float) -> dict[str, Any]:
    """Launch each run at its arrival (in units of the shortest run's length alone), to the end of the last."""
    load_before, ids = load_average(), [""] * len(trace)
    started = time.monotonic()
    for item in sorted(trace, key=lambda r: r["arrival_s"]):
        time.sleep(max(0.0, started + item["arrival_s"] * unit_s - time.monotonic()))
        experiment = experiments[(item["cpus"], item["steps"])]
        ids[item["index"]] = api.call(f"/api/experiments/{experiment}/launch/", {"priority": item["priority"]})["id"]
    runs = wait_until_all_end(api, ids, deadline)
    figures = []
    for item, run in zip(trace, runs):
        if run["state"] != "succeeded":
            raise BenchError(f"run {run['id']} ended {run['state']}: {run['state_reason']}")
        admitted, held = holding(api.call(f"/api/runs/{run['id']}/transitions/"))
        figures.append(
            {
                **item,
                "id": run["id"],
                "launched_at": at(run["created_at"]),
                "admitted_at": admitted,
                "held_s": round(held, 2),
                "finished_at": at(run["finished_at"]),
                "attempts": run["attempt"] + 1,
            }
        )
    return {"load_average_before": load_before, "load_average_after": load_average(), "runs": figures}


def real_figures(phase: dict[str, Any], capacity: float, alone_s: dict) -> dict[str, Any]:
    runs = phase["runs"]
    first = min(r["launched_at"] for r in runs)
    makespan = max(r["finished_at"] for r in runs) - first
    granted = sum(r["cpus"] * r["held_s"] for r in runs)
    completions = [r["finished_at"] - r["launched_at"] for r in runs]
    slowdowns = [c / alone_s[(r["cpus"], r["steps"])] for r, c in zip(runs, completions)]
    return {
        "makespan_s": round(makespan, 1),
        "utilisation": round(granted / (capacity * makespan), 4) if makespan > 0 else None,
        "mean_completion_s": round(statistics.fmean(completions), 1),
        "p95_slowdown": round(percentile(slowdowns, 0.95) or 0.0, 3),
    }


def calibrate(api: Api, env: dict[str, str], assets: Path, shortest_steps: int, cpus: int, deadline: float) -> dict:
    """One run per size at the shortest length, alone: its median seconds per step (the engine's
    `timing/step`) and the rest of its wall time (submission, start-up, loading: the overhead of any run)."""
    pace = {}
    for size in range(1, cpus + 1):
        overrides = [f"train.steps={shortest_steps}", "logging.eval_every=0"] + [
            f"placement.cpus_per_{role}={size}" for role in ("trainer", "rollout_engine")
        ]
        launched = manage(env, "demo_launch", str(assets), *[a for o in overrides for a in ("--set", o)])
        run_id = line_value(launched, "demo run launched: ")
        (run,) = wait_until_all_end(api, [run_id], deadline)
        whole = at(run["finished_at"]) - at(run["created_at"])
        steps = api.call(f"/api/runs/{run_id}/metrics/?names=timing/step")["series"]["timing/step"]["values"]
        step_s = statistics.median(steps)
        pace[size] = {
            "run": run_id,
            "experiment": run["experiment"],
            "alone_s": round(whole, 2),
            "step_s": round(step_s, 3),
            "overhead_s": round(max(0.0, whole - step_s * shortest_steps), 2),
        }
        log(f"calibration: {size} CPU(s), {shortest_steps} steps alone in {whole:.1f} s ({step_s:.2f} s a step)")
    return pace


def make_experiments(api: Api, pace: dict, trace: list[dict], shortest_steps: int) -> tuple[dict, dict]:
    """An experiment per (size, length), each declaring train.max_wall_s; and each one's length alone."""
    experiments, alone = {}, {}
    for size, steps in sorted({(r["cpus"], r["steps"]) for r in trace}):
        base = api.call(f"/api/experiments/{pace[size]['experiment']}/")
        alone[(size, steps)] = pace[size]["overhead_s"] + pace[size]["step_s"] * steps
        config = {**base["config"], "train": {**base["config"]["train"], "steps": steps}}
        # The user's declared limit: half again the run's length alone (the engine holds its steps to it).
        config["train"]["max_wall_s"] = round(1.5 * alone[(size, steps)], 1)
        created = api.call(
            "/api/experiments/",
            {
                "name": f"trace {size} cpu {steps} steps",
                "model": base["model"],
                "dataset": base["dataset"],
                "rewards": base["rewards"],
                "config": config,
            },
        )
        experiments[(size, steps)] = created["id"]
    return experiments, alone


def real(args: argparse.Namespace, home: Path, report: dict[str, Any]) -> None:
    base_env = stack_env(home)
    if not (args.assets / "manifest.json").exists():
        log(f"building the demo assets in {args.assets}")
        run_checked([str(PYTHON), "-m", "rl_engine", "demo", "build", str(args.assets)], base_env)
    manage(base_env, "migrate", "--noinput", "-v0")
    manage(base_env, "ensure_admin")
    token = line_value(manage(base_env, "create_user", "trace-bench", "--role", "researcher", "--token"), "API token: ")
    # The Ray head gets `nproc` CPUs (scripts/demo.sh), which OMP_NUM_THREADS lowers: sizes up to that.
    cpus = min(2, int(run_checked(["nproc"], base_env).strip() or 1))
    trace = real_trace(args.runs, args.shortest_steps, args.seed, cpus)
    report["real"] = {"trace": trace, "cpus": cpus}
    experiments = alone = None
    for mode, flag in MODES.items():
        env = {**base_env, "POSTTRAIN_SCHEDULER_BACKFILL": flag}
        log(f"starting the stack with POSTTRAIN_SCHEDULER_BACKFILL={flag}")
        with stack(env, home):
            api = Api(f"http://127.0.0.1:{env['POSTTRAIN_PORT']}", token)
            deadline = time.monotonic() + args.timeout_s
            if experiments is None:
                pace = calibrate(api, env, args.assets, args.shortest_steps, cpus, deadline)
                experiments, alone = make_experiments(api, pace, trace, args.shortest_steps)
                report["real"]["calibration"] = pace
            unit = min(p["alone_s"] for p in report["real"]["calibration"].values())
            phase = replay(api, trace, experiments, unit, deadline)
            report["real"][mode] = {**phase, **real_figures(phase, float(cpus), alone)}
    report["real"]["started_later_with_backfill"] = _later(
        _starts(report["real"]["backfill"]["runs"]), _starts(report["real"]["in-order"]["runs"]), ADMISSION_NOISE_S
    )
    report["real"]["comparison"] = _compare(report["real"]["in-order"], report["real"]["backfill"], "utilisation")


def _starts(runs: list[dict[str, Any]]) -> dict[str, tuple[str, float]]:
    """Each run's admission, in seconds from its phase's first launch (the phases ran at different times)."""
    first = min(r["launched_at"] for r in runs)
    return {str(r["index"]): (r["priority"], r["admitted_at"] - first) for r in runs}


def verdict(report: dict[str, Any]) -> dict[str, Any]:
    goals: dict[str, Any] = {}
    if "real" in report and "comparison" in report["real"]:
        c = report["real"]["comparison"]
        later = report["real"]["started_later_with_backfill"]
        goals["real_utilisation"] = (c["utilisation_backfill"] or 0) >= GOAL_UTILISATION
        goals["real_mean_completion_drop"] = (c["mean_completion_drop"] or 0) >= GOAL_COMPLETION_DROP
        goals["real_no_higher_priority_run_later"] = later["normal"]["runs"] == 0 and later["high"]["runs"] == 0
    if "simulated" in report:
        goals["simulated_pass_at_200_waiting"] = report["simulated"]["pass_at_200_waiting_ms"]["median_ms"] <= (
            GOAL_PASS_S * 1000
        )
        later = report["simulated"]["started_later_with_backfill"]
        goals["simulated_no_higher_priority_run_later"] = later["normal"]["runs"] == 0 and later["high"]["runs"] == 0
    return goals


def main() -> None:
    parser = argparse.ArgumentParser(description="In-order admission against backfill on a mixed job trace.")
    parser.add_argument("--smoke", action="store_true", help="the smallest size: a quick look, not a measurement")
    part = parser.add_mutually_exclusive_group()
    part.add_argument("--sim-only", action="store_true", help="only the simulated 64-GPU cluster")
    part.add_argument("--real-only", action="store_true", help="only the real stack")
    parser.add_argument("--runs", type=int, default=16, help="runs in the real stack's trace")
    parser.add_argument("--shortest-steps", type=int, default=4, help="training steps of the shortest real run")
    parser.add_argument("--sim-runs", type=int, default=1000, help="runs in the simulated trace")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=3600, help="per real-stack mode, from its stack's start")
    parser.add_argument("--assets", type=Path, default=REPO / ".demo" / "assets", help="a demo build (made if absent)")
    parser.add_argument("--keep-home", action="store_true", help="keep the temporary POSTTRAIN_HOME (logs, SQLite)")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.shortest_steps, args.sim_runs = 4, 1, 100
    if min(args.runs, args.shortest_steps, args.sim_runs) < 1:
        parser.error("--runs, --shortest-steps and --sim-runs must be at least 1")
    args.assets = args.assets.resolve()

    _servers.guard()  # a signal or the parent's death unwinds through the stack's context, which stops it
    json_out = os.fdopen(os.dup(1), "w")  # stdout carries the JSON only; the commands' output goes to stderr
    os.dup2(2, 1)
    machine = MachineLoad()
    started = time.monotonic()
    home = Path(tempfile.mkdtemp(prefix="pt-trace-bench-"))
    report: dict[str, Any] = {
        "bench": "queue_trace",
        "smoke": args.smoke,
        "cpus": os.cpu_count(),
        "load_average_start": load_average(),
        "error": None,
    }
    try:
        if not args.real_only:
            report["simulated"] = simulated(args.sim_runs, args.seed)
        if not args.sim_only:
            real(args, home, report)
    except (BenchError, OSError) as exc:  # OSError: the platform's API did not answer
        report["error"] = str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"
        log(f"error: {report['error']}")
    except KeyboardInterrupt:
        report["error"] = "interrupted"
    finally:
        shutil.rmtree(stack_env(home)["POSTTRAIN_RAY_TMP"], ignore_errors=True)
        if args.keep_home:
            report["home"] = str(home)
        else:
            shutil.rmtree(home, ignore_errors=True)
    report["goals_met"] = verdict(report)
    report["load_average_end"] = load_average()
    report["wall_s"] = round(time.monotonic() - started, 1)
    report["machine"] = machine.report()
    print(json.dumps(report, indent=1, default=str), file=json_out, flush=True)
    sys.exit(1 if report["error"] else 0)


if __name__ == "__main__":
    main()
