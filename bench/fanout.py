"""Live fan-out: C Server-Sent-Events clients (default 50, a browser's run page each) on R live runs
(default 10), each run posting a `metrics` event every 1/rate s through the ingestion endpoint. Measured:
engine event → client, from the moment the engine's request starts to the moment a client has read the
event's message off its stream, over every (client, event) pair: p50/p95/max, and messages missed.

The server is the real one (uvicorn, one worker, on a fresh Postgres database) with the live channel in
process by default or on Redis with `--redis-url` (production: every web process sees every batch). The
runs are external runs made through the API as a researcher (`POST /api/runs/external/`), the clients
read `GET /api/runs/<id>/stream/` with the researcher's token. Everything runs on one machine: on a small,
shared one the clients and posters take CPU from the server, which the figures include.

    .venv/bin/python bench/fanout.py [--clients 50] [--runs 10] [--seconds 20] [--rate 10] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers, ingest  # the servers and databases of the ingestion benches
from bench._machine import MachineLoad
from bench.ingest_load import quantile


class Clock:
    """When each run's event seq was sent (the poster writes, the clients read)."""

    def __init__(self) -> None:
        self.sent: dict[tuple[str, int], float] = {}
        self.lock = threading.Lock()

    def mark(self, run_id: str, seq: int) -> None:
        with self.lock:
            self.sent[(run_id, seq)] = time.perf_counter()


def post_events(base: str, run: dict[str, Any], steps: int, rate: float, clock: Clock) -> None:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {run['ingest_token']}"
    started = time.perf_counter()
    for step in range(1, steps + 1):
        time.sleep(max(0.0, started + step / rate - time.perf_counter()))
        event = {"run": run["id"], "seq": step, "type": "metrics", "step": step, "time": time.time()}
        event["data"] = {"reward/mean": step / steps, "kl/mean": 0.01}
        clock.mark(run["id"], step)
        session.post(run["events_url"], json={"events": [event]}, timeout=60).raise_for_status()


def follow(base: str, token: str, run_id: str, steps: int, received: list[tuple[str, int, float]], ready) -> None:
    from posttrain_sdk.sse import read_stream

    headers = {"Authorization": f"Token {token}"}
    with requests.get(f"{base}/api/runs/{run_id}/stream/", headers=headers, stream=True, timeout=(10, 120)) as response:
        ready.wait()
        for message in read_stream(response.iter_lines(decode_unicode=True)):
            if message.event == "metrics":
                received.append((run_id, message.id, time.perf_counter()))
                if message.id >= steps:
                    return


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=10.0, help="events per second per run")
    ap.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432"))
    ap.add_argument("--redis-url", default=None, help="the live channel on Redis (default: in process)")
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-fanout-"))
    machine = MachineLoad()
    pg = ingest.Postgres(args.pg_url)
    server, token = ingest.start_ours_for_a_researcher(pg, workdir, redis_url=args.redis_url)
    base = server.url
    steps = int(args.seconds * args.rate)
    try:
        api = requests.Session()
        api.headers["Authorization"] = f"Token {token}"
        runs = []
        for i in range(args.runs):
            answer = api.post(
                f"{base}/api/runs/external/", json={"experiment": "fanout", "name": f"live {i}"}, timeout=60
            )
            answer.raise_for_status()
            body = answer.json()
            runs.append(
                {"id": body["run"]["id"], "ingest_token": body["ingest_token"], "events_url": body["events_url"]}
            )
        clock, received, ready = Clock(), [], threading.Event()
        readers = [
            threading.Thread(
                target=follow, args=(base, token, runs[c % args.runs]["id"], steps, received, ready), daemon=True
            )
            for c in range(args.clients)
        ]
        for reader in readers:
            reader.start()
        time.sleep(2.0)  # every client has subscribed before the first event
        ready.set()
        ingest.log(f"{args.clients} clients on {args.runs} runs, {steps} events each at {args.rate}/s ({base})")
        posters = [threading.Thread(target=post_events, args=(base, run, steps, args.rate, clock)) for run in runs]
        for poster in posters:
            poster.start()
        for thread in posters + readers:
            thread.join(timeout=args.seconds + 120)
        latencies = [at - clock.sent[(run_id, seq)] for run_id, seq, at in received if (run_id, seq) in clock.sent]
        expected = args.clients * steps
        out = {
            "bench": "fanout",
            "clients": args.clients,
            "runs": args.runs,
            "events_per_run": steps,
            "rate_per_run": args.rate,
            "live_channel": "redis" if args.redis_url else "in-process",
            "messages_expected": expected,
            "messages_received": len(received),
            "messages_missed": expected - len(received),
            "event_to_client_p50_s": round(quantile(latencies, 0.50), 4),
            "event_to_client_p95_s": round(quantile(latencies, 0.95), 4),
            "event_to_client_max_s": round(max(latencies, default=float("nan")), 4),
            "goal_p95_le_0_2_s": quantile(latencies, 0.95) <= 0.2,
            "machine": machine.report(),
        }
        print(json.dumps(out, indent=2))
        return 0 if out["messages_missed"] == 0 else 1
    except Exception:
        ingest.log_server_tails([server])
        raise
    finally:
        server.stop()
        pg.drop(ingest.OURS_DB)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    _servers.run_bench(main)
