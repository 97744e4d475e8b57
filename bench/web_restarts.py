"""The web server SIGKILLed and restarted three times while R simulated runs stream E events in all
(default 4 runs, 1,000,000 events): afterwards every run's stored events are its events.jsonl, each seq
once. The bench form of tests/faults/test_web_restarts.py (which streams ~12,000 to fit the test budget).

Each run is bench/simulated_run.py (the SDK's event log and sender, as the engine ships events), logging
as fast as it can: one `metrics` event (10 names) and one `samples` event (2 rows) per step. The server is
uvicorn on a fresh Postgres database; it is killed when 25 %, 50 % and 75 % of the events are stored and
started again on the same port. Reported: events stored, lost and stored twice per run, the wall time,
the outages, and the sustained events/s.

    .venv/bin/python bench/web_restarts.py [--runs 4] [--events 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import ingest  # the servers and databases of the ingestion benches

STORED_SQL = "SELECT COALESCE(SUM(last_seq), 0) FROM runs_run"


def start_server(env: dict[str, str], workdir: Path, port: int | None = None) -> tuple[subprocess.Popen, str]:
    process, url = ingest.start_ours(env, workdir, port)
    ingest.wait_for_http(f"{url}/login/", 120, process)
    return process, url


def check_run(pg: ingest.Postgres, folder: Path) -> dict[str, int]:
    """Stored against the run folder: metrics rows by seq, samples by (step, index), the run's last_seq."""
    from posttrain_sdk.event_log import read_events

    events = read_events(folder / "events.jsonl")
    run_id = folder.name
    metrics = [e["seq"] for e in events if e["type"] == "metrics"]
    samples = sum(len(e["data"]["samples"]) for e in events if e["type"] == "samples")
    stored_metrics = int(pg.scalar(ingest.OURS_DB, "SELECT COUNT(*) FROM runs_metricrow WHERE run_id = %s", (run_id,)))
    distinct = int(
        pg.scalar(ingest.OURS_DB, "SELECT COUNT(DISTINCT seq) FROM runs_metricrow WHERE run_id = %s", (run_id,))
    )
    stored_samples = int(pg.scalar(ingest.OURS_DB, "SELECT COUNT(*) FROM runs_sample WHERE run_id = %s", (run_id,)))
    last_seq = int(pg.scalar(ingest.OURS_DB, "SELECT last_seq FROM runs_run WHERE id = %s", (run_id,)))
    return {
        "events": len(events),
        "last_seq": last_seq,
        "lost": (len(events) - last_seq) + (len(metrics) - distinct) + max(0, samples - stored_samples),
        "stored_twice": (stored_metrics - distinct) + max(0, stored_samples - samples),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--events", type=int, default=1_000_000, help="metrics and samples events in all")
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432"))
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-web-restarts-"))
    pg = ingest.Postgres(args.pg_url)
    env, token = ingest.prepare_for_a_researcher(pg, workdir)
    process, url = start_server(env, workdir)
    port = int(url.rsplit(":", 1)[1])
    steps = args.events // (2 * args.runs)
    clients = []
    try:
        started = time.perf_counter()
        for i in range(args.runs):
            command = [sys.executable, "-m", "bench.simulated_run", "--url", url, "--token", token]
            command += ["--dir", str(workdir / "runs"), "--name", f"stream {i}", "--steps", str(steps), "--rate", "0"]
            command += ["--metrics", "10", "--samples", "2", "--flush-timeout", "3600"]
            clients.append(subprocess.Popen(command, cwd=ingest.REPO, stdout=subprocess.PIPE, text=True))
        run_ids = [json.loads(client.stdout.readline())["run"] for client in clients]
        total = steps * 2 * args.runs
        outages = []
        for k in range(1, args.restarts + 1):
            while int(pg.scalar(ingest.OURS_DB, STORED_SQL)) < total * k // (args.restarts + 1):
                time.sleep(0.2)
            down = time.perf_counter()
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            process, _ = start_server(env, workdir, port)
            outages.append(round(time.perf_counter() - down, 2))
            ingest.log(f"restart {k}: {int(pg.scalar(ingest.OURS_DB, STORED_SQL))} of {total} stored")
        codes = [client.wait() for client in clients]
        wall = time.perf_counter() - started
        per_run = {run_id: check_run(pg, workdir / "runs" / run_id) for run_id in run_ids}
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
            "machine": {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]},
        }
        print(json.dumps(out, indent=2))
        return 0 if out["lost"] == 0 and out["stored_twice"] == 0 and out["clients_delivered_everything"] else 1
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()
        ingest.stop_process_group(process)
        pg.drop(ingest.OURS_DB)


if __name__ == "__main__":
    sys.exit(main())
