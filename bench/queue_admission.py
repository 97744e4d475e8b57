"""The scheduler against the old all-at-once submission: four demo-size runs of a fixed length launched at once.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/queue_admission.py [--steps 20] [--runs 4] [--timeout-s 1800]
        [--assets .demo/assets] [--keep-home]

The stack is the one `make demo` starts (bench/stack_memory.py's helpers: a temporary POSTTRAIN_HOME on free
ports, SQLite, a Ray head with as many CPUs as the machine has), started twice from the same home: once with
`POSTTRAIN_SCHEDULER=admission` (the default) and once with `POSTTRAIN_SCHEDULER=all-at-once` (every launched
run is submitted to Ray at once, as before the scheduler). Every run is the same demo run (`train.steps` =
--steps, no evaluation, the same seed), so "the same run alone" is exact:

1. solo: under admission, one run launched on an idle cluster (`manage.py demo_launch`), to its end;
2. admission: --runs runs launched at once through the REST API, to the end of the last;
3. all-at-once: the same, with the stack restarted in all-at-once mode.

Per run: wall time from launch to end, time queued (launch -> running), and the median of its `timing/step`
(the engine's own seconds per training step). Per phase: the makespan, first launch to last end. Ratios
against the issue's goals: makespan with admission <= 0.5x all-at-once and <= 1.1x the sum of the runs'
solo times (--runs x the solo run's wall time); each admitted run's median step <= 1.2x the solo median.

The machine's load average is recorded at the start and end of each phase: on a machine shared with other
work the figures carry its noise. Prints one JSON document on stdout (progress on stderr); exits 1 when a run
did not succeed or a phase timed out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers
from bench.stack_memory import (
    DEMO_SH,
    REPO,
    TERMINAL,
    Api,
    BenchError,
    demo_sh,
    ensure_demo_build,
    line_value,
    manage,
    measure_in_a_home,
    stack_env,
)

GOAL_MAKESPAN_VS_ALL_AT_ONCE = 0.5
GOAL_MAKESPAN_VS_SOLO_SUM = 1.1
GOAL_STEP_VS_SOLO = 1.2
MODES = ("admission", "all-at-once")


def log(message: str) -> None:
    print(f"[bench queue] {message}", file=sys.stderr, flush=True)


def at(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def wait_until_all_end(api: Api, run_ids: list[str], deadline: float) -> None:
    """Polls the runs until each has ended; reports each change of the step counts."""
    last = None
    while True:
        runs = [api.call(f"/api/runs/{run_id}/") for run_id in run_ids]
        progress = [f"{r['state']}@{r['last_step'] or 0}" for r in runs]
        if progress != last:
            log(" ".join(progress))
            last = progress
        if all(r["state"] in TERMINAL for r in runs):
            return
        if time.monotonic() > deadline:
            raise BenchError(f"timed out (--timeout-s): {' '.join(progress)}")
        time.sleep(2)


def run_figures(api: Api, run_id: str) -> dict[str, Any]:
    """One run's wall time, time queued, and the median of the engine's seconds per training step."""
    run = api.call(f"/api/runs/{run_id}/")
    steps = api.call(f"/api/runs/{run_id}/metrics/?names=timing/step")["series"]["timing/step"]["values"]
    created, started, finished = at(run["created_at"]), at(run["started_at"]), at(run["finished_at"])
    if run["state"] != "succeeded":
        raise BenchError(f"run {run_id} ended {run['state']}: {run['state_reason']}")
    return {
        "id": run_id,
        "state": run["state"],
        "steps": run["last_step"],
        "launched_at": created,
        "finished_at": finished,
        "wall_s": round(finished - created, 2),
        "queued_s": round(started - created, 2) if started else None,
        "median_step_s": round(statistics.median(steps), 4) if steps else None,
    }


def phase(api: Api, experiment_id: str, runs: int, deadline: float) -> dict[str, Any]:
    """`runs` runs of the experiment launched at once, to the end of the last: the makespan and each run."""
    load_before = load_average()
    ids = [api.call(f"/api/experiments/{experiment_id}/launch/", method="POST")["id"] for _ in range(runs)]
    log(f"launched {len(ids)} runs")
    wait_until_all_end(api, ids, deadline)
    figures = [run_figures(api, run_id) for run_id in ids]
    makespan = max(f["finished_at"] for f in figures) - min(f["launched_at"] for f in figures)
    return {
        "makespan_s": round(makespan, 2),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "runs": figures,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def verdict(report: dict[str, Any]) -> dict[str, Any]:
    solo, admitted, all_at_once = report["solo"], report["admission"], report["all-at-once"]
    solo_sum = solo["wall_s"] * len(admitted["runs"])
    step_ratios = [ratio(r["median_step_s"], solo["median_step_s"]) for r in admitted["runs"]]
    ratios = {
        "makespan_admission_vs_all_at_once": ratio(admitted["makespan_s"], all_at_once["makespan_s"]),
        "makespan_admission_vs_solo_sum": ratio(admitted["makespan_s"], solo_sum),
        "median_step_admitted_vs_solo": step_ratios,
        "median_step_all_at_once_vs_solo": [
            ratio(r["median_step_s"], solo["median_step_s"]) for r in all_at_once["runs"]
        ],
    }
    goals = {
        "makespan_vs_all_at_once": ratios["makespan_admission_vs_all_at_once"] <= GOAL_MAKESPAN_VS_ALL_AT_ONCE,
        "makespan_vs_solo_sum": ratios["makespan_admission_vs_solo_sum"] <= GOAL_MAKESPAN_VS_SOLO_SUM,
        "step_vs_solo": all(r is not None and r <= GOAL_STEP_VS_SOLO for r in step_ratios),
    }
    return {"solo_sum_s": round(solo_sum, 2), "ratios": ratios, "goals_met": goals}


def measure(args: argparse.Namespace, home: Path, report: dict[str, Any]) -> None:
    base_env = stack_env(home)
    base_env["POSTTRAIN_IMPORT_ROOTS"] = str(args.assets)  # the platform registers server files from there only
    log(f"demo assets in {args.assets}")
    ensure_demo_build(args.assets, base_env)
    report["model_size"] = json.loads((args.assets / "manifest.json").read_text()).get("model_size")
    manage(base_env, "migrate", "--noinput", "-v0")
    manage(base_env, "ensure_admin")
    token = line_value(manage(base_env, "create_user", "queue-bench", "--role", "researcher", "--token"), "API token: ")
    manage(base_env, "project_member", "default", "queue-bench", "member")  # the demo's objects are there
    api = Api(f"http://127.0.0.1:{base_env['POSTTRAIN_PORT']}", token)
    overrides = [f"train.steps={args.steps}", "logging.eval_every=0"]
    report["overrides"] = overrides
    experiment_id = None
    for mode in MODES:
        env = {**base_env, "POSTTRAIN_SCHEDULER": mode}
        log(f"starting the stack with POSTTRAIN_SCHEDULER={mode}")
        stack_stopped = _servers.on_stop_run([str(DEMO_SH), "stop"], env=env)
        try:  # a stack that failed to start whole is stopped too
            if demo_sh(env, "start") != 0:
                raise BenchError(f"scripts/demo.sh start failed; see {home / 'logs'} (--keep-home keeps it)")
            deadline = time.monotonic() + args.timeout_s
            if experiment_id is None:  # the solo run, on the idle cluster
                load_before = load_average()
                launched = manage(env, "demo_launch", str(args.assets), *[a for o in overrides for a in ("--set", o)])
                solo_id = line_value(launched, "demo run launched: ")
                experiment_id = line_value(launched, "(experiment ").rstrip(",")
                log(f"solo run {solo_id} of experiment {experiment_id}")
                wait_until_all_end(api, [solo_id], deadline)
                report["solo"] = {
                    **run_figures(api, solo_id),
                    "load_average_before": load_before,
                    "load_average_after": load_average(),
                }
            report[mode] = phase(api, experiment_id, args.runs, deadline)
            report["cluster"] = api.call("/api/queue/")["cluster"] if mode == "admission" else report.get("cluster")
        finally:
            log("stopping the stack")
            demo_sh(env, "stop")
            stack_stopped()
    report.update(verdict(report))


def main() -> int:
    parser = argparse.ArgumentParser(description="Admission against all-at-once: makespan and step times.")
    parser.add_argument("--steps", type=int, default=20, help="training steps of every run")
    parser.add_argument("--runs", type=int, default=4, help="runs launched at once in each mode")
    parser.add_argument("--timeout-s", type=float, default=1800, help="per mode, from its stack's start")
    parser.add_argument(
        "--assets",
        type=Path,
        default=REPO / ".demo" / "assets",
        help="a demo build, used as it is (e.g. a tiny one for a quick look); made by `python -m rl_engine demo "
        "build` if it has no manifest.json",
    )
    parser.add_argument("--keep-home", action="store_true", help="keep the temporary POSTTRAIN_HOME (logs, SQLite)")
    args = parser.parse_args()
    if args.steps < 1 or args.runs < 1:
        parser.error("--steps and --runs must be at least 1")
    args.assets = args.assets.resolve()

    report: dict[str, Any] = {
        "bench": "queue_admission",
        "steps": args.steps,
        "runs": args.runs,
        "cpus": os.cpu_count(),
    }
    return measure_in_a_home(measure, args, report, "pt-queue-bench-")


if __name__ == "__main__":
    _servers.run_bench(main)
