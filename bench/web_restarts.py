"""The web server SIGKILLed and restarted three times while R simulated runs stream E events in all
(default 4 runs, 1,000,000 events): afterwards every run's stored events are its events.jsonl, each seq
once. The bench form of tests/faults/test_web_restarts.py (which streams ~12,000 to fit the test budget).

Each run is bench/simulated_run.py (the SDK's event log and sender, as the engine ships events), logging
as fast as it can: one `metrics` event (10 names) and one `samples` event per step, whose rollout file (2
rows) the sender uploads before it. The server is uvicorn on a fresh Postgres database; it is killed when
25 %, 50 % and 75 % of the events are stored and started again on the same port. Reported: events stored,
lost and stored twice per run (a rollout file counts as lost when its index row is missing, or the store
lacks it or holds other bytes than the SDK wrote), the wall time, the outages, and the sustained events/s.

    .venv/bin/python bench/web_restarts.py [--runs 4] [--events 1000000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers, ingest  # the servers and databases of the ingestion benches
from bench._machine import MachineLoad

STORED_SQL = "SELECT COALESCE(SUM(last_seq), 0) FROM runs_run"


def start_server(env: dict[str, str], workdir: Path, port: int | None = None) -> _servers.Server:
    return ingest.start_ours(env, workdir, port).wait_until_up("/login/")


def check_run(pg: ingest.Postgres, folder: Path, store: Path) -> dict[str, int]:
    """Stored against the run folder: metrics rows by seq, rollout files by name (index row and bytes in
    the store), the run's last_seq."""
    from posttrain_sdk.event_log import read_events

    events = read_events(folder / "events.jsonl")
    run_id = folder.name
    metrics = [e["seq"] for e in events if e["type"] == "metrics"]
    announced = {e["data"]["file"]: e["data"]["sha256"] for e in events if e["type"] == "samples"}
    stored_metrics = int(
        pg.scalar(ingest.OURS_DB, "SELECT COUNT(*) FROM telemetry_metricrow WHERE run_id = %s", (run_id,))
    )
    distinct = int(
        pg.scalar(ingest.OURS_DB, "SELECT COUNT(DISTINCT seq) FROM telemetry_metricrow WHERE run_id = %s", (run_id,))
    )
    indexed = int(pg.scalar(ingest.OURS_DB, "SELECT COUNT(*) FROM telemetry_rolloutfile WHERE run_id = %s", (run_id,)))
    distinct_files = int(
        pg.scalar(ingest.OURS_DB, "SELECT COUNT(DISTINCT name) FROM telemetry_rolloutfile WHERE run_id = %s", (run_id,))
    )
    rollouts = store / "runs" / run_id / "rollouts"
    missing_files = sum(
        not (rollouts / name).is_file() or hashlib.sha256((rollouts / name).read_bytes()).hexdigest() != sha
        for name, sha in announced.items()
    )
    last_seq = int(pg.scalar(ingest.OURS_DB, "SELECT last_seq FROM runs_run WHERE id = %s", (run_id,)))
    return {
        "events": len(events),
        "last_seq": last_seq,
        "rollout_files": len(announced),
        "lost": (len(events) - last_seq)
        + (len(metrics) - distinct)
        + (len(announced) - distinct_files)
        + missing_files,
        "stored_twice": (stored_metrics - distinct) + (indexed - distinct_files),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--events", type=int, default=1_000_000, help="metrics and samples events in all")
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432"))
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-web-restarts-"))
    machine = MachineLoad()
    pg = ingest.Postgres(args.pg_url)
    env, token = ingest.prepare_for_a_researcher(pg, workdir)
    store = workdir / "rollout-store"
    env["POSTTRAIN_ROLLOUT_STORE"] = str(store)  # where the uploaded rollout files land, checked at the end
    server = start_server(env, workdir)
    url = server.url
    port = int(url.rsplit(":", 1)[1])
    steps = args.events // (2 * args.runs)
    clients: list[subprocess.Popen] = []
    try:
        started = time.perf_counter()
        for i in range(args.runs):
            command = [sys.executable, "-m", "bench.simulated_run", "--url", url, "--token", token]
            command += ["--dir", str(workdir / "runs"), "--name", f"stream {i}", "--steps", str(steps), "--rate", "0"]
            command += ["--metrics", "10", "--samples", "2", "--flush-timeout", "3600"]
            clients.append(
                _servers.child(
                    command,
                    cwd=ingest.REPO,
                    stdout=subprocess.PIPE,
                    stderr=(workdir / f"client-{i}.log").open("w"),
                    text=True,
                )
            )
        run_ids = [registered(client, workdir / f"client-{i}.log") for i, client in enumerate(clients)]
        total = steps * 2 * args.runs
        outages = []
        for k in range(1, args.restarts + 1):
            while int(pg.scalar(ingest.OURS_DB, STORED_SQL)) < total * k // (args.restarts + 1):
                time.sleep(0.2)
            down = time.perf_counter()
            server.kill()
            server = start_server(env, workdir, port)
            outages.append(round(time.perf_counter() - down, 2))
            ingest.log(f"restart {k}: {int(pg.scalar(ingest.OURS_DB, STORED_SQL))} of {total} stored")
        codes = [client.wait() for client in clients]
        for i, code in enumerate(codes):
            if code != 0:
                ingest.log(
                    f"client {i} exited with {code}; the end of its stderr:\n{_servers.log_tail(workdir / f'client-{i}.log')}"
                )
        wall = time.perf_counter() - started
        per_run = {run_id: check_run(pg, workdir / "runs" / run_id, store) for run_id in run_ids}
        out = {
            "bench": "web_restarts",
            "runs": args.runs,
            "events_streamed": total,
            "restarts": args.restarts,
            "outages_s": outages,
            "wall_s": round(wall, 1),
            "events_per_s": round(total / wall),
            "clients_delivered_everything": all(code == 0 for code in codes),
            "lost": sum(r["lost"] for r in per_run.values()),
            "stored_twice": sum(r["stored_twice"] for r in per_run.values()),
            "per_run": per_run,
            "machine": machine.report(),
        }
        print(json.dumps(out, indent=2))
        return 0 if out["lost"] == 0 and out["stored_twice"] == 0 and out["clients_delivered_everything"] else 1
    except Exception:
        ingest.log_server_tails([server])
        raise
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()
        server.stop()
        pg.drop(ingest.OURS_DB)
        shutil.rmtree(workdir, ignore_errors=True)


def registered(client: subprocess.Popen, stderr: Path) -> str:
    """The run id a simulated run prints once registered; ProcessFailed with its stderr's tail if it exits first."""
    line = client.stdout.readline() if client.stdout else ""
    if not line:
        client.wait()
        raise _servers.ProcessFailed(
            f"a simulated run exited with {client.returncode} before it registered; the end of its stderr:\n"
            + _servers.log_tail(stderr)
        )
    return json.loads(line)["run"]


if __name__ == "__main__":
    _servers.run_bench(main)
