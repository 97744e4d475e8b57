"""Ingestion under live load: N concurrent simulated runs (default 100), each at 10 steps/s with 50 metrics
and a batch of rollouts every step, against the real server (uvicorn on Postgres); then the same metrics
load against an MLflow tracking server (`runs/log-batch`), one after the other, on the same Postgres server.

Each run is one client thread on its own keep-alive connection, sending each step as the SDK's sender does
when it keeps up: ours uploads the step's rollout file (S rows as Parquet, `PUT /api/runs/<id>/rollouts/
<name>/upload`) and then posts `{"events": [metrics (50 names), samples (the file's reference)]}` to
`/api/runs/<id>/events`, both with the run's bearer token; MLflow gets 50 metrics on `runs/log-batch`. The
files are encoded before the clock starts (one per step, the same for every run). A thread that falls behind
its schedule sends at once (never skips a step), so the offered load is fixed and a server that cannot keep
up shows as a sustained rate under it and a lag. Reported per system: sustained points/s (metric points
acknowledged / time until the last was acknowledged), requests/s, p50/p95/max time of the events request
(ours: the upload's apart), steps/s achieved per run (target `--rate`), and events lost (what the database
holds against what was acknowledged: stored seqs and index rows for ours, metric rows for MLflow).

MLflow comes from a separate venv (`--mlflow-venv`, default `.bench-venv`; bench/README.md says how to
make it); without one that half is reported as not measured. Servers, databases (`bench_posttrain`,
`bench_mlflow`) and threads are set up and torn down by the script. The client runs on the same machine
as the servers: on a small, shared machine it takes a share of the CPU the servers could have used.

    .venv/bin/python bench/ingest_load.py [--runs 100] [--seconds 20] [--rate 10] [--metrics 50] [--samples 8] [--no-mlflow]
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers, ingest  # the servers, databases and runs of the throughput bench
from bench._machine import MachineLoad


@dataclass
class RunLoad:
    """One simulated run's client: what it sent, how long each request took, when it finished."""

    path: str
    headers: dict[str, str]
    latencies: list[float] = field(default_factory=list)  # the step's events (or log-batch) request
    upload_latencies: list[float] = field(default_factory=list)  # ours: the step's rollout file
    acknowledged_points: int = 0
    acknowledged_steps: int = 0
    failures: list[str] = field(default_factory=list)
    finished_at: float = 0.0


def metrics_values(step: int, names: int) -> dict[str, float]:
    return {f"load/m{i:03d}": math.sin(step * 0.01 + i) for i in range(names)}


def sample_row(step: int, index: int) -> dict[str, Any]:
    """One rollout as the engine reports it (every field the event schema requires)."""
    response = str(step + index)
    return {
        "index": index,
        "group": index // 2,
        "prompt": f"{step} + {index} =",
        "response": response,
        "label": response,
        "reward": float(index % 2),
        "components": {"correct": float(index % 2)},
        "advantage": 0.0,
        "length": len(response),
        "finish_reason": "stop",
        "kept": True,
        "errors": [],
    }


@dataclass(frozen=True)
class StepFile:
    """A step's rollout file as the SDK writes it: its bytes and its `samples` event's data."""

    name: str
    data: bytes
    event_data: dict[str, Any]


def step_files(steps: int, samples: int) -> dict[int, StepFile]:
    """One rollout file per step (the SDK's format), encoded once: every run uploads the same bytes."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sdk"))
    import hashlib

    from posttrain_sdk import rollout_files

    files = {}
    for step in range(1, steps + 1):
        table = rollout_files.rows_table([sample_row(step, i) for i in range(samples)], step)
        data = rollout_files.encode(table, {"step": str(step)})
        name = rollout_files.file_name(step)
        info = rollout_files.FileInfo(
            name, step, 0, table.num_rows, len(data), hashlib.sha256(data).hexdigest(), rollout_files.table_stats(table)
        )
        files[step] = StepFile(name, data, info.event_data())
    return files


def ours_body(run_id: str, step: int, names: int, file: StepFile | None) -> bytes:
    now = time.time()
    events = [
        {
            "run": run_id,
            "seq": 2 * step - 1,
            "type": "metrics",
            "step": step,
            "time": now,
            "data": metrics_values(step, names),
        }
    ]
    if file is not None:
        events.append(
            {"run": run_id, "seq": 2 * step, "type": "samples", "step": step, "time": now, "data": file.event_data}
        )
    return json.dumps({"events": events}).encode()


def mlflow_body(run_id: str, step: int, names: int) -> bytes:
    stamp = int(time.time() * 1000)
    metrics = [{"key": k, "value": v, "timestamp": stamp, "step": step} for k, v in metrics_values(step, names).items()]
    return json.dumps({"run_id": run_id, "metrics": metrics}).encode()


def drive(
    base_url: str, loads: list[RunLoad], bodies, steps: int, rate: float, points_per_step: int, uploads=None
) -> float:
    """Every load in its own thread, released together, each paced at `rate` steps/s; the wall time
    until the last request was answered. `uploads(index, step)`: (path, bytes) to PUT before the step's
    request, or None."""
    parsed = urllib.parse.urlsplit(base_url)
    barrier = threading.Barrier(len(loads) + 1)

    def client(load: RunLoad, index: int) -> None:
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
        barrier.wait()
        started = time.perf_counter()
        try:
            for step in range(1, steps + 1):
                delay = started + (step - 1) / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                upload = uploads(index, step) if uploads is not None else None
                if upload is not None:
                    path, data = upload
                    t0 = time.perf_counter()
                    headers = {**load.headers, "Content-Type": "application/vnd.apache.parquet"}
                    conn.request("PUT", path, data, headers)
                    response = conn.getresponse()
                    payload = response.read()
                    load.upload_latencies.append(time.perf_counter() - t0)
                    if response.status != 201:
                        load.failures.append(f"step {step} upload: HTTP {response.status} {payload[:200]!r}")
                        return
                body = bodies(index, step)
                t0 = time.perf_counter()
                conn.request("POST", load.path, body, load.headers)
                response = conn.getresponse()
                payload = response.read()
                load.latencies.append(time.perf_counter() - t0)
                if response.status != 200:
                    load.failures.append(f"step {step}: HTTP {response.status} {payload[:200]!r}")
                    return
                load.acknowledged_points += points_per_step
                load.acknowledged_steps += 1
        except (OSError, http.client.HTTPException) as exc:
            load.failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            load.finished_at = time.perf_counter()
            conn.close()

    threads = [threading.Thread(target=client, args=(load, i), daemon=True) for i, load in enumerate(loads)]
    for thread in threads:
        thread.start()
    barrier.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    return max(load.finished_at for load in loads) - t0


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def report(loads: list[RunLoad], wall_s: float, steps: int, lost: int, stored_points: int) -> dict[str, Any]:
    latencies = [x for load in loads for x in load.latencies]
    uploads = [x for load in loads for x in load.upload_latencies]
    points = sum(load.acknowledged_points for load in loads)
    failures = [f for load in loads for f in load.failures]
    out: dict[str, Any] = {
        "wall_s": round(wall_s, 2),
        "points_acknowledged": points,
        "points_stored": stored_points,
        "sustained_points_per_s": round(points / wall_s),
        "requests_per_s": round((len(latencies) + len(uploads)) / wall_s, 1),
        "p50_ms": round(quantile(latencies, 0.50) * 1000, 1),
        "p95_ms": round(quantile(latencies, 0.95) * 1000, 1),
        "max_ms": round(max(latencies, default=float("nan")) * 1000, 1),
        "steps_per_s_per_run": round(steps / wall_s, 2),
        "events_lost": lost,
        "failed_runs": len(failures),
        "first_failure": failures[0] if failures else None,
    }
    if uploads:
        out["upload_p50_ms"] = round(quantile(uploads, 0.50) * 1000, 1)
        out["upload_p95_ms"] = round(quantile(uploads, 0.95) * 1000, 1)
    return out


def load_ours(args, pg: ingest.Postgres, workdir: Path) -> dict[str, Any]:
    pg.recreate(ingest.OURS_DB)
    env = ingest.ours_env(pg, workdir, secrets.token_urlsafe(40), args.redis_url)
    runs = ingest.prepare_ours(env, args.runs)
    server = ingest.start_ours(env, workdir)
    try:
        url = server.wait_until_up("/login/").url
        loads = [
            RunLoad(
                f"/api/runs/{run_id}/events", {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
            )
            for run_id, token in runs
        ]
        steps = int(args.seconds * args.rate)
        files = step_files(steps, args.samples) if args.samples else {}
        ingest.log(f"ours: {args.runs} runs x {steps} steps at {args.rate}/s ({url})")
        wall = drive(
            url,
            loads,
            lambda i, step: ours_body(runs[i][0], step, args.metrics, files.get(step)),
            steps,
            args.rate,
            args.metrics,
            uploads=(
                (lambda i, step: (f"/api/runs/{runs[i][0]}/rollouts/{files[step].name}/upload", files[step].data))
                if files
                else None
            ),
        )
        events_per_run = steps * (2 if args.samples else 1)
        stored_seq = ingest.Postgres.scalar(pg, ingest.OURS_DB, "SELECT COALESCE(SUM(last_seq), 0) FROM runs_run")
        acknowledged_steps = sum(load.acknowledged_steps for load in loads)
        acknowledged_events = acknowledged_steps * (2 if args.samples else 1)
        stored_rows = pg.scalar(ingest.OURS_DB, "SELECT COUNT(*) FROM telemetry_metricrow")
        # Every acknowledged samples event left one index row (the rollout file's), none twice.
        acknowledged_files = acknowledged_steps if args.samples else 0
        stored_files = int(pg.scalar(ingest.OURS_DB, "SELECT COUNT(*) FROM telemetry_rolloutfile"))
        lost = max(0, acknowledged_events - int(stored_seq)) + abs(acknowledged_files - stored_files)
        result = report(loads, wall, steps, lost, int(stored_rows) * args.metrics)
        result["rollout_files_stored"] = stored_files
        result["events_per_run"] = events_per_run
        result["samples_per_step"] = args.samples
        return result
    except Exception:
        ingest.log_server_tails([server])
        raise
    finally:
        server.stop()
        pg.drop(ingest.OURS_DB)


def load_mlflow(args, pg: ingest.Postgres, workdir: Path) -> dict[str, Any]:
    pg.recreate(ingest.MLFLOW_DB)
    server = ingest.start_mlflow(pg, workdir)
    try:
        url = server.wait_until_up("/health", 300).url
        experiment = ingest.http_json("POST", f"{url}/api/2.0/mlflow/experiments/create", {"name": "ingest-load"})
        run_ids = [ingest.mlflow_new_run(url, experiment["experiment_id"], f"load {i}") for i in range(args.runs)]
        path = "/api/2.0/mlflow/runs/log-batch"
        loads = [RunLoad(path, {"Content-Type": "application/json"}) for _ in run_ids]
        steps = int((args.mlflow_seconds or args.seconds) * args.rate)
        ingest.log(f"mlflow: {args.runs} runs x {steps} steps at {args.rate}/s ({url})")
        wall = drive(
            url, loads, lambda i, step: mlflow_body(run_ids[i], step, args.metrics), steps, args.rate, args.metrics
        )
        stored = int(pg.scalar(ingest.MLFLOW_DB, "SELECT COUNT(*) FROM metrics"))
        acknowledged = sum(load.acknowledged_points for load in loads)
        return report(loads, wall, steps, max(0, acknowledged - stored), stored)
    except Exception:
        ingest.log_server_tails([server])
        raise
    finally:
        server.stop()
        pg.drop(ingest.MLFLOW_DB)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20.0, help="how long each run logs at --rate")
    ap.add_argument("--rate", type=float, default=10.0, help="steps per second per run")
    ap.add_argument("--mlflow-seconds", type=float, default=None, help="a shorter load for MLflow (default: --seconds)")
    ap.add_argument("--metrics", type=int, default=50, help="metrics per step")
    ap.add_argument("--samples", type=int, default=8, help="rollouts in each step's file (ours only; 0: none)")
    ap.add_argument("--mlflow-venv", type=Path, default=ingest.BENCH_VENV, help="a venv with mlflow (bench/README.md)")
    ap.add_argument("--no-mlflow", action="store_true", help="ours alone, even where a venv with mlflow exists")
    ap.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432"))
    ap.add_argument("--redis-url", default=None, help="give ours REDIS_URL (the live channel on Redis)")
    args = ap.parse_args()

    ingest.BENCH_VENV = args.mlflow_venv
    pg = ingest.Postgres(args.pg_url)
    workdir = Path(tempfile.mkdtemp(prefix="bench-ingest-load-"))
    machine = MachineLoad()
    out: dict[str, Any] = {
        "bench": "ingest_load",
        "load": {"runs": args.runs, "seconds": args.seconds, "rate": args.rate, "metrics": args.metrics},
        "mlflow_seconds": args.mlflow_seconds or args.seconds,
        "offered_points_per_s": round(args.runs * args.rate * args.metrics),
    }
    try:
        out["ours"] = load_ours(args, pg, workdir)
        if args.no_mlflow:
            out["mlflow"] = "not measured (--no-mlflow)"
        elif (args.mlflow_venv / "bin" / "mlflow").exists():
            out["mlflow"] = load_mlflow(args, pg, workdir)
            out["mlflow"]["version"] = ingest.mlflow_version()
            ratio = out["ours"]["sustained_points_per_s"] / max(1, out["mlflow"]["sustained_points_per_s"])
            out["ours_over_mlflow_points_per_s"] = round(ratio, 2)
        else:
            out["mlflow"] = f"not measured: no mlflow in {args.mlflow_venv} (bench/README.md says how to make it)"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out["machine"] = machine.report()
    out["goals"] = {
        "p95_ms_le_100": out["ours"]["p95_ms"] <= 100,
        "zero_lost": out["ours"]["events_lost"] == 0,
        "ten_x_mlflow": out.get("ours_over_mlflow_points_per_s", 0) >= 10,
    }
    print(json.dumps(out, indent=2))
    return 0 if out["ours"]["events_lost"] == 0 and not out["ours"]["failed_runs"] else 1


if __name__ == "__main__":
    _servers.run_bench(main)
