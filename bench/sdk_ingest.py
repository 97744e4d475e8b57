"""Points per second one SDK client logs, against MLflow's client `log_batch` on its own server.

Both servers run on this machine against the same Postgres, one worker each (bench/ingest.py's set-up):
uvicorn for ours, `mlflow server --workers 1` from the bench-only venv `.bench-venv/` (made here if
missing). Each client runs in a fresh process of its own:

- ours:   `posttrain_sdk.init(...)`, then `run.log({K metrics}, step=s)` for S steps, then `run.finish()`,
          which returns once the server acknowledged every event. The SDK writes each call to its local
          event log and its sender ships the file in batches (500 events per request).
- MLflow: `MlflowClient.log_batch(run_id, metrics=[...])` with 1000 metrics a call (MLflow's limit),
          S x K points in all, then `set_terminated`.

The clock runs from the first logging call to the moment every point is stored (ours: finish() returned
True; MLflow: the last log_batch returned, each call being synchronous). Same shape on both sides: S steps
of K names, the values differ per point. Each repeat alternates the order; medians are reported, with the
ours/MLflow ratio (goal: at least 3x). At the end the stored points are counted in both databases; the
process exits 1 if a count is off. Both databases are dropped.

    .venv/bin/python bench/sdk_ingest.py [--steps 4000] [--metrics-per-step 50] [--repeats 3] [--no-mlflow]
                                         [--pg-url postgres://postgres@127.0.0.1:5432]

Prints one JSON document on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers, ingest  # the servers, the databases, the bench venv
from bench._machine import MachineLoad
from bench._servers import REPO

ingest.OURS_DB = ingest.bench_db("bench_sdk_posttrain")
ingest.MLFLOW_DB = ingest.bench_db("bench_sdk_mlflow")

OURS_CLIENT = """
import json, sys, time
sys.path.insert(0, sys.argv[5])
import posttrain_sdk as posttrain
url, token, steps, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
keys = [f"bench/metric_{k}" for k in range(names)]
run = posttrain.init("bench sdk", f"run {time.time()}", {"steps": steps}, url=url, token=token, dir=sys.argv[6],
                     heartbeat_s=0)
started = time.perf_counter()
for step in range(steps):
    run.log({key: step * 0.001 + k for k, key in enumerate(keys)}, step=step)
logged = time.perf_counter() - started
delivered = run.finish(timeout_s=3600)
print(json.dumps({"seconds": time.perf_counter() - started, "log_calls_s": logged, "delivered": delivered,
                  "run": run.id}))
"""

MLFLOW_CLIENT = """
import json, sys, time
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
url, experiment, steps, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
client = MlflowClient(tracking_uri=url)
run = client.create_run(experiment, run_name=f"run {time.time()}")
keys = [f"bench/metric_{k}" for k in range(names)]
started = time.perf_counter()
batch = []
for step in range(steps):
    now = int(time.time() * 1000)
    for k, key in enumerate(keys):
        batch.append(Metric(key, step * 0.001 + k, now, step))
        if len(batch) == 1000:
            client.log_batch(run.info.run_id, metrics=batch)
            batch = []
if batch:
    client.log_batch(run.info.run_id, metrics=batch)
seconds = time.perf_counter() - started
client.set_terminated(run.info.run_id)
print(json.dumps({"seconds": seconds, "run": run.info.run_id}))
"""


def client_run(command: list[str], what: str) -> dict[str, Any]:
    done = _servers.run_checked(command, what, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--metrics-per-step", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-mlflow", action="store_true", help="ours alone (no MLflow peer, no bench venv made)")
    ap.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432"))
    args = ap.parse_args()
    points = args.steps * args.metrics_per_step
    machine = MachineLoad()
    systems = ("ours",) if args.no_mlflow else ("ours", "mlflow")
    if "mlflow" in systems:
        ingest.ensure_bench_venv()
    pg = ingest.Postgres(args.pg_url)
    workdir = Path(tempfile.mkdtemp(prefix="bench-sdk-ingest-"))
    servers: list[_servers.Server] = []
    try:
        if "mlflow" in systems:
            pg.recreate(ingest.MLFLOW_DB)
            servers.append(mlflow := ingest.start_mlflow(pg, workdir))  # migrates its database while ours does
        ours, token = ingest.start_ours_for_a_researcher(pg, workdir)
        servers.append(ours)
        py = str(ingest.OURS_BIN / "python")
        commands = {"ours": [py, "-c", OURS_CLIENT, ours.url, token]}
        ours_tail = [str(REPO / "sdk"), str(workdir / "sdk-runs")]
        if "mlflow" in systems:
            mlflow.wait_until_up("/health", 300)
            experiment = ingest.http_json(
                "POST", f"{mlflow.url}/api/2.0/mlflow/experiments/create", {"name": "bench-sdk"}
            )["experiment_id"]
            commands["mlflow"] = [
                str(ingest.BENCH_VENV / "bin" / "python"),
                "-c",
                MLFLOW_CLIENT,
                mlflow.url,
                experiment,
            ]
        shape = [str(args.steps), str(args.metrics_per_step)]
        ingest.log("warm-up")
        for system in systems:
            client_run([*commands[system], "20", "5", *(ours_tail if system == "ours" else [])], f"{system}'s client")
        per_repeat: dict[str, list[dict[str, Any]]] = {system: [] for system in systems}
        for repeat in range(args.repeats):
            for system in systems if repeat % 2 == 0 else systems[::-1]:
                command = [*commands[system], *shape, *(ours_tail if system == "ours" else [])]
                result = client_run(command, f"{system}'s client")
                if system == "ours" and not result["delivered"]:
                    raise RuntimeError("the SDK did not deliver every event")
                result["points_per_s"] = points / result["seconds"]
                per_repeat[system].append(result)
                ingest.log(f"repeat {repeat} {system}: {result['points_per_s']:,.0f} points/s")

        stored = {
            r["run"]: pg.scalar(
                ingest.OURS_DB,
                "SELECT COALESCE(SUM((SELECT COUNT(*) FROM jsonb_object_keys(m.values))), 0) FROM telemetry_metricrow m "
                "WHERE m.run_id = %s",
                (r["run"],),
            )
            for r in per_repeat["ours"]
        }
        if "mlflow" in systems:
            stored |= {
                r["run"]: pg.scalar(ingest.MLFLOW_DB, "SELECT COUNT(*) FROM metrics WHERE run_uuid = %s", (r["run"],))
                for r in per_repeat["mlflow"]
            }
        counts_ok = all(v == points for v in stored.values())
        ours_rate = statistics.median(r["points_per_s"] for r in per_repeat["ours"])
        report: dict[str, Any] = {
            "bench": "sdk_ingest",
            "shape": {"steps": args.steps, "metrics_per_step": args.metrics_per_step, "points": points},
            "repeats": args.repeats,
            "ours": {
                "points_per_s_median": ours_rate,
                "log_calls_s_median": statistics.median(r["log_calls_s"] for r in per_repeat["ours"]),
                "per_repeat": per_repeat["ours"],
            },
            "goal": ">= 3x",
            "stored_points_ok": counts_ok,
        }
        if "mlflow" in systems:
            mlflow_rate = statistics.median(r["points_per_s"] for r in per_repeat["mlflow"])
            report["mlflow_version"] = ingest.mlflow_version()
            report["mlflow"] = {"points_per_s_median": mlflow_rate, "per_repeat": per_repeat["mlflow"]}
            report["ours_over_mlflow"] = ours_rate / mlflow_rate
        else:
            report["mlflow"] = "not measured (--no-mlflow)"
        report["machine"] = machine.report()
        print(json.dumps(report, indent=2))
        return 0 if counts_ok else 1
    except Exception:
        ingest.log_server_tails(servers)
        raise
    finally:
        for server in reversed(servers):
            server.stop()
        pg.drop(ingest.OURS_DB)
        if "mlflow" in systems:
            pg.drop(ingest.MLFLOW_DB)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    _servers.run_bench(main)
