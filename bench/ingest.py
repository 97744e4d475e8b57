"""Metric ingestion speed: points per second into Postgres, our ingestion API vs an MLflow tracking server.

Both servers run on this machine against the same Postgres, one worker each (uvicorn for both):

- ours:   `uvicorn posttrain.asgi:application` (the project's .venv), `POST /api/runs/<id>/events` with the
          run's bearer token; a request carries B `metrics` events (one per step, K metric names each),
          seq contiguous per run.
- MLflow: `mlflow server --workers 1` (a bench-only venv, .bench-venv/, created here if missing),
          `POST /api/2.0/mlflow/runs/log-batch` with B x K metrics per call (MLflow's limit is 1000).

The default shape is the same for both: 1000 points per request (K=50 names x B=20 steps), N=200k points
per load. Request bodies are encoded before the clock starts and each client thread keeps one HTTP/1.1
connection (stdlib http.client, the layer under urllib), so the client costs the same on both sides.
A load with T threads uses T runs (ours needs contiguous seq per run), N/T points each. After a short
warm-up, each (threads, system) load runs `--repeats` times, the order of the systems alternating;
the medians are reported. At the end, stored points are counted in both databases and against MLflow's
get-history. Both servers are stopped and both databases dropped.

    .venv/bin/python bench/ingest.py [--points 200000] [--metrics-per-step 50] [--steps-per-request 20]
                                     [--repeats 3] [--threads 1] [--no-mlflow] [--pg-url postgres://postgres@127.0.0.1:5432]

Prints one JSON document on stdout (progress goes to stderr). The databases are named bench_*, with
$BENCH_DB_SUFFIX appended (two benches on one Postgres server at once each need their own).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers
from bench._machine import MachineLoad
from bench._servers import REPO, Server

OURS_BIN = REPO / ".venv" / "bin"
BENCH_VENV = REPO / ".bench-venv"
# 3.18.0 is listed on the index but its mlflow-skinny==3.18.0 is not, so it does not install here.
MLFLOW_REQUIREMENTS = ["mlflow==3.17.2", "psycopg2-binary==2.9.13"]
WARMUP_REQUESTS = 10

try:
    import psycopg
except ImportError:  # run with another Python: re-run under the project's venv (Django's psycopg)
    if Path(sys.executable) != OURS_BIN / "python" and (OURS_BIN / "python").exists():
        os.execv(str(OURS_BIN / "python"), [str(OURS_BIN / "python"), *sys.argv])
    raise

os.environ.setdefault("OMP_NUM_THREADS", "1")


def bench_db(name: str) -> str:
    """A bench's database name: `name` and $BENCH_DB_SUFFIX (benches on one Postgres server at once, as the
    test suite's engineers run them, each need their own)."""
    return name + os.environ.get("BENCH_DB_SUFFIX", "")


OURS_DB, MLFLOW_DB = bench_db("bench_posttrain"), bench_db("bench_mlflow")


def log(message: str) -> None:
    print(f"[ingest {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- Postgres ------------------------------------------------------------------------------------


class Postgres:
    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")

    def url(self, db: str, scheme: str = "postgres") -> str:
        return f"{scheme}://{self.base_url.split('://', 1)[1]}/{db}"

    def admin(self, sql: str) -> None:
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(sql)

    def recreate(self, db: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        self.admin(f'CREATE DATABASE "{db}"')

    def drop(self, db: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')

    def scalar(self, db: str, sql: str, params: tuple = ()) -> Any:
        with psycopg.connect(self.url(db)) as conn:
            return conn.execute(sql, params).fetchone()[0]


# --- the two servers -----------------------------------------------------------------------------


def ensure_bench_venv() -> None:
    if (BENCH_VENV / "bin" / "mlflow").exists():
        return
    log(f"creating {BENCH_VENV} with {' '.join(MLFLOW_REQUIREMENTS)} (once)")
    subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
    subprocess.run([str(BENCH_VENV / "bin" / "pip"), "install", "-q", *MLFLOW_REQUIREMENTS], check=True)


def mlflow_version() -> str:
    out = subprocess.run(
        [str(BENCH_VENV / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('mlflow'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def start_mlflow(pg: Postgres, workdir: Path, database: str | None = None) -> Server:
    """MLflow's tracking server on `database` (default MLFLOW_DB); wait for it with `.wait_until_up("/health")`."""
    return _servers.start_mlflow(
        BENCH_VENV / "bin" / "mlflow", pg.url(database or MLFLOW_DB, "postgresql+psycopg2"), workdir
    )


def ours_env(pg: Postgres, workdir: Path, secret: str, redis_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "CELERY_BROKER_URL")}
    env.update(
        DATABASE_URL=pg.url(OURS_DB),
        POSTTRAIN_HOME=str(workdir / "posttrain-home"),
        POSTTRAIN_SECRET_KEY=secret,
        OMP_NUM_THREADS="1",
    )
    if redis_url:
        env["REDIS_URL"] = redis_url
    return env


_CREATE_RUNS = """
import json, os, uuid
from posttrain.registry.models import Dataset, ModelAsset
from posttrain.runs.models import Experiment, Run, RunState
from posttrain.core.run_tokens import ingest_token, token_hash
model = ModelAsset.objects.create(name="bench-ingest", path="/nonexistent")
data = Dataset.objects.create(name="bench-ingest", sha256="0" * 64, format="jsonl", path="/nonexistent",
                              size_bytes=0, row_count=0)
experiment = Experiment.objects.create(name="bench ingest", model=model, dataset=data, config={})
out = []
for i in range(int(os.environ["BENCH_RUNS"])):
    run_id = uuid.uuid4()
    Run.objects.create(id=run_id, experiment=experiment, name=f"bench ingest #{i}", state=RunState.RUNNING,
                       ingest_token_hash=token_hash(ingest_token(run_id)))
    out.append([str(run_id), ingest_token(run_id)])
print("BENCH_RUNS_JSON " + json.dumps(out))
"""


def migrate(env: dict[str, str]) -> None:
    _servers.run_checked(
        [str(OURS_BIN / "python"), "manage.py", "migrate", "--noinput", "-v0"], "migrate", cwd=REPO, env=env
    )


def manage_shell(env: dict[str, str], code: str, marker: str) -> str:
    """Runs `code` in `manage.py shell`; the rest of the line it printed after `marker`."""
    done = _servers.run_checked(
        [str(OURS_BIN / "python"), "manage.py", "shell", "-c", code], "manage.py shell", cwd=REPO, env=env
    )
    return next(x for x in done.stdout.splitlines() if x.startswith(marker + " ")).split(" ", 1)[1]


def prepare_ours(env: dict[str, str], n_runs: int) -> list[tuple[str, str]]:
    """Migrate the fresh database and create the runs (id, bearer token) through Django."""
    migrate(env)
    made = manage_shell({**env, "BENCH_RUNS": str(n_runs)}, _CREATE_RUNS, "BENCH_RUNS_JSON")
    return [tuple(pair) for pair in json.loads(made)]


def start_ours(env: dict[str, str], workdir: Path, port: int | None = None) -> Server:
    """uvicorn on `port` (default: a free one; the same port again is a restart as clients see it); wait for it
    with `.wait_until_up("/login/")`."""
    return _servers.start_uvicorn(env, workdir / "ours.log", port)


# The researcher owns one project, the one its runs and uploads go into when they name none.
_CREATE_USER = """
from posttrain.accounts.services import token_get_or_create, user_create
from posttrain.projects.services import project_create
user = user_create("bench", "a-long-bench-passphrase", "researcher")
project_create("bench", user=user)
print("BENCH_TOKEN " + token_get_or_create(user).key)
"""


def prepare_for_a_researcher(pg: Postgres, workdir: Path, redis_url: str | None = None) -> tuple[dict[str, str], str]:
    """A fresh, migrated OURS_DB with one researcher: (the server's environment, the researcher's API token)."""
    pg.recreate(OURS_DB)
    env = ours_env(pg, workdir, secrets.token_urlsafe(40), redis_url)
    migrate(env)
    return env, manage_shell(env, _CREATE_USER, "BENCH_TOKEN")


def start_ours_for_a_researcher(pg: Postgres, workdir: Path, redis_url: str | None = None) -> tuple[Server, str]:
    """Ours on a fresh, migrated OURS_DB with one researcher, answering: (the server, the researcher's API
    token), for benches that drive the platform as a user (the SDK) rather than as the engine."""
    env, token = prepare_for_a_researcher(pg, workdir, redis_url)
    server = start_ours(env, workdir).wait_until_up("/login/")
    return server, token


# --- HTTP client ---------------------------------------------------------------------------------


def http_json(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


class Request:
    __slots__ = ("path", "body", "headers", "check")

    def __init__(self, path: str, body: bytes, headers: dict[str, str], check: Any = None):
        self.path, self.body, self.headers, self.check = path, body, headers, check


def run_load(base_url: str, per_thread: list[list[Request]]) -> dict[str, Any]:
    """One thread per request list, each on its own keep-alive connection, all released together."""
    parsed = urllib.parse.urlsplit(base_url)
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(per_thread) + 1)

    def worker(requests: list[Request]) -> None:
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=300)
        conn.connect()
        mine: list[float] = []
        barrier.wait()
        try:
            for r in requests:
                t0 = time.perf_counter()
                conn.request("POST", r.path, r.body, r.headers)
                response = conn.getresponse()
                payload = response.read()
                mine.append(time.perf_counter() - t0)
                if response.status != 200 or (r.check is not None and not r.check(payload)):
                    with lock:
                        failures.append(f"{r.path}: HTTP {response.status} {payload[:300]!r}")
                    return
        except Exception as exc:
            with lock:
                failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()
            with lock:
                latencies.extend(mine)

    threads = [threading.Thread(target=worker, args=(reqs,)) for reqs in per_thread]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if failures:
        raise RuntimeError(f"{len(failures)} failed request(s), first: {failures[0]}")
    return {"wall_s": wall, "latencies": latencies}


# --- payloads ------------------------------------------------------------------------------------


class Shape:
    def __init__(self, metrics_per_step: int, steps_per_request: int):
        self.k, self.b = metrics_per_step, steps_per_request
        self.names = [f"train/metric_{i:03d}" for i in range(metrics_per_step)]
        self.points_per_request = metrics_per_step * steps_per_request
        self.t0 = time.time()

    def values(self, seed: int, first_step: int) -> list[list[float]]:
        rng = random.Random(seed * 1_000_003 + first_step)
        return [[rng.random() for _ in range(self.k)] for _ in range(self.b)]

    def ours(self, run_id: str, token: str, n_requests: int, seed: int) -> list[Request]:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        path = f"/api/runs/{run_id}/events"
        out = []
        for i in range(n_requests):
            first = i * self.b
            events = [
                {
                    "run": run_id,
                    "seq": first + j + 1,
                    "type": "metrics",
                    "step": first + j,
                    "time": self.t0 + (first + j) * 0.01,
                    "data": dict(zip(self.names, row)),
                }
                for j, row in enumerate(self.values(seed, first))
            ]
            expected = first + self.b
            out.append(
                Request(
                    path,
                    json.dumps({"events": events}, separators=(",", ":")).encode(),
                    headers,
                    lambda p, e=expected: json.loads(p).get("acknowledged_seq") == e,
                )
            )
        return out

    def mlflow(self, run_id: str, n_requests: int, seed: int) -> list[Request]:
        headers = {"Content-Type": "application/json"}
        out = []
        for i in range(n_requests):
            first = i * self.b
            metrics = [
                {
                    "key": name,
                    "value": value,
                    "timestamp": int((self.t0 + (first + j) * 0.01) * 1000),
                    "step": first + j,
                }
                for j, row in enumerate(self.values(seed, first))
                for name, value in zip(self.names, row)
            ]
            out.append(
                Request(
                    "/api/2.0/mlflow/runs/log-batch",
                    json.dumps({"run_id": run_id, "metrics": metrics}, separators=(",", ":")).encode(),
                    headers,
                )
            )
        return out


def mlflow_new_run(base_url: str, experiment_id: str, name: str) -> str:
    body = {"experiment_id": experiment_id, "start_time": int(time.time() * 1000), "run_name": name}
    return http_json("POST", f"{base_url}/api/2.0/mlflow/runs/create", body)["run"]["info"]["run_id"]


# --- measurement ---------------------------------------------------------------------------------


def summarize(result: dict[str, Any], points: int, requests: int) -> dict[str, Any]:
    lat = sorted(result["latencies"])
    return {
        "wall_s": round(result["wall_s"], 3),
        "points_per_s": round(points / result["wall_s"], 1),
        "requests_per_s": round(requests / result["wall_s"], 2),
        "p50_ms": round(statistics.median(lat) * 1000, 2),
        "p95_ms": round(statistics.quantiles(lat, n=100, method="inclusive")[94] * 1000, 2) if len(lat) > 1 else None,
        "max_ms": round(lat[-1] * 1000, 2),
    }


def medians(per_repeat: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("wall_s", "points_per_s", "requests_per_s", "p50_ms", "p95_ms", "max_ms")
    out = {k: round(statistics.median(r[k] for r in per_repeat), 3) for k in keys if per_repeat[0][k] is not None}
    out["per_repeat"] = per_repeat
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=200_000, help="points per load (split over the threads)")
    ap.add_argument("--metrics-per-step", type=int, default=50)
    ap.add_argument("--steps-per-request", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--threads", type=int, nargs="+", default=[1], help="client threads per load, one run each (e.g. 1 4)"
    )
    ap.add_argument("--no-mlflow", action="store_true", help="ours alone (no MLflow peer, no bench venv made)")
    ap.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432"),
        help="Postgres server (no database); both systems get a fresh database there",
    )
    ap.add_argument(
        "--redis-url",
        default=None,
        help="give ours REDIS_URL (live channel on Redis, as in production); default: in-process",
    )
    args = ap.parse_args()
    shape = Shape(args.metrics_per_step, args.steps_per_request)
    if shape.points_per_request > 1000:
        ap.error("MLflow takes at most 1000 metrics per log-batch: metrics-per-step x steps-per-request <= 1000")

    started = time.perf_counter()
    machine = MachineLoad()
    systems = ("ours",) if args.no_mlflow else ("ours", "mlflow")
    if "mlflow" in systems:
        ensure_bench_venv()
    pg = Postgres(args.pg_url)
    workdir = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    n_runs = 1 + args.repeats * sum(args.threads)
    servers: list[Server] = []
    try:
        pg.recreate(OURS_DB)
        if "mlflow" in systems:
            pg.recreate(MLFLOW_DB)
            servers.append(mlflow := start_mlflow(pg, workdir))  # migrates its database while ours does
        env = ours_env(pg, workdir, secrets.token_urlsafe(40), args.redis_url)
        ours_runs = prepare_ours(env, n_runs)
        servers.append(ours := start_ours(env, workdir).wait_until_up("/login/"))
        urls = {"ours": ours.url}
        if "mlflow" in systems:
            urls["mlflow"] = mlflow.wait_until_up("/health", 300).url
            experiment_id = http_json(
                "POST", f"{urls['mlflow']}/api/2.0/mlflow/experiments/create", {"name": "bench-ingest"}
            )["experiment_id"]
        setup_s = time.perf_counter() - started
        log(f"servers up after {setup_s:.1f}s ({', '.join(f'{k} {v}' for k, v in urls.items())})")

        # Warm-up: a few requests to a run of each that is not measured.
        warm_ours = shape.ours(*ours_runs[0], n_requests=WARMUP_REQUESTS, seed=0)
        run_load(urls["ours"], [warm_ours])
        request_bytes = {"ours": round(statistics.mean(len(r.body) for r in warm_ours))}
        if "mlflow" in systems:
            warm_mlflow = shape.mlflow(
                mlflow_new_run(urls["mlflow"], experiment_id, "warm-up"), WARMUP_REQUESTS, seed=0
            )
            run_load(urls["mlflow"], [warm_mlflow])
            request_bytes["mlflow"] = round(statistics.mean(len(r.body) for r in warm_mlflow))

        next_ours = iter(ours_runs[1:])
        used: dict[str, list[tuple[str, int]]] = {system: [] for system in systems}  # (run id, points expected)
        results: dict[str, Any] = {}
        for threads in args.threads:
            per_thread_requests = max(1, round(args.points / shape.points_per_request / threads))
            requests = per_thread_requests * threads
            points = requests * shape.points_per_request
            per_repeat: dict[str, list[dict[str, Any]]] = {system: [] for system in systems}
            for repeat in range(args.repeats):
                for system in systems if repeat % 2 == 0 else systems[::-1]:
                    loads = []
                    for t in range(threads):
                        seed = 1000 * threads + 10 * repeat + t + 1
                        if system == "ours":
                            run_id, token = next(next_ours)
                            loads.append(shape.ours(run_id, token, per_thread_requests, seed))
                        else:
                            run_id = mlflow_new_run(urls["mlflow"], experiment_id, f"t{threads}-r{repeat}-{t}")
                            loads.append(shape.mlflow(run_id, per_thread_requests, seed))
                        used[system].append((run_id, per_thread_requests * shape.points_per_request))
                    result = summarize(run_load(urls[system], loads), points, requests)
                    per_repeat[system].append(result)
                    log(
                        f"threads={threads} repeat={repeat} {system}: {result['points_per_s']:.0f} points/s, "
                        f"p50 {result['p50_ms']} ms, p95 {result['p95_ms']} ms"
                    )
            entry: dict[str, Any] = {
                "threads": threads,
                "runs_per_system": threads,
                "requests": requests,
                "points": points,
                **{system: medians(per_repeat[system]) for system in systems},
            }
            if "mlflow" in systems:
                entry["ratio_points_per_s_ours_over_mlflow"] = round(
                    entry["ours"]["points_per_s"] / entry["mlflow"]["points_per_s"], 2
                )
                entry["ratio_per_repeat"] = [
                    round(o["points_per_s"] / m["points_per_s"], 2)
                    for o, m in zip(per_repeat["ours"], per_repeat["mlflow"])
                ]
            else:
                entry["mlflow"] = "not measured (--no-mlflow)"
            results[f"threads_{threads}"] = entry

        # Correctness: every measured run holds exactly the points sent.
        expected = sum(p for _, p in used["ours"])
        ours_stored = sum(
            int(
                pg.scalar(
                    OURS_DB,
                    "SELECT coalesce(sum((SELECT count(*) FROM jsonb_object_keys(m.values))), 0) "
                    "FROM telemetry_metricrow m WHERE m.run_id = %s::uuid",
                    (run_id,),
                )
            )
            for run_id, _ in used["ours"]
        )
        ours_rows = sum(
            int(pg.scalar(OURS_DB, "SELECT count(*) FROM telemetry_metricrow WHERE run_id = %s::uuid", (r,)))
            for r, _ in used["ours"]
        )
        verification: dict[str, Any] = {
            "points_expected_per_system": expected,
            "ours_points_stored": ours_stored,
            "ours_metric_rows": ours_rows,
        }
        verification["ok"] = ours_stored == expected
        if "mlflow" in systems:
            verification.update(verify_mlflow(pg, urls["mlflow"], used["mlflow"], shape))
            verification["ok"] = (
                verification["ok"] and verification.pop("mlflow_ok") and verification["mlflow_metrics_rows"] == expected
            )

        versions = {
            **({"mlflow": mlflow_version()} if "mlflow" in systems else {}),
            "postgres": pg.scalar("postgres", "SHOW server_version"),
            "python": sys.version.split()[0],
        }
        doc = {
            "bench": "ingest",
            "what": "metric points/s into Postgres: POST /api/runs/<id>/events (ours) vs MLflow runs/log-batch",
            "config": {
                "points_per_load": args.points,
                "metrics_per_step": shape.k,
                "steps_per_request": shape.b,
                "points_per_request": shape.points_per_request,
                "repeats": args.repeats,
                "threads": args.threads,
                "systems": list(systems),
                "warmup_requests": WARMUP_REQUESTS,
                "order": "alternating per repeat (ours first on even repeats)",
                "client": "stdlib http.client, one keep-alive connection per thread, bodies encoded before the clock",
                "request_bytes": request_bytes,
                "ours_server": "uvicorn posttrain.asgi:application, 1 worker, DATABASE_URL on Postgres, "
                f"POSTTRAIN_DB_CONN_MAX_AGE={env.get('POSTTRAIN_DB_CONN_MAX_AGE', '0')}, "
                f"live channel {'redis' if args.redis_url else 'in-process'}",
                "mlflow_server": "mlflow server --workers 1 (uvicorn), --backend-store-uri postgresql+psycopg2:// (SQLAlchemy pool)",
            },
            "versions": versions,
            "results": results,
            "verification": verification,
            "setup_s": round(setup_s, 1),
            "total_s": round(time.perf_counter() - started, 1),
            "machine": machine.report(),
        }
        print(json.dumps(doc, indent=2))
        return 0 if verification["ok"] else 1
    except Exception:
        log_server_tails(servers)
        raise
    finally:
        for server in reversed(servers):
            server.stop()
        for db in (OURS_DB, MLFLOW_DB) if "mlflow" in systems else (OURS_DB,):
            try:
                pg.drop(db)
            except Exception as exc:
                log(f"could not drop {db}: {exc}")
        shutil.rmtree(workdir, ignore_errors=True)


def log_server_tails(servers: list[Server]) -> None:
    """What the servers said last, for a bench that failed while they ran."""
    for server in servers:
        log(f"--- the end of {server.name}'s log ({server.log_path}) ---\n{_servers.log_tail(server.log_path)}")


def verify_mlflow(pg: Postgres, url: str, used: list[tuple[str, int]], shape: Shape) -> dict[str, Any]:
    """MLflow's stored rows for the measured runs, and `get-history` of one metric of the last run."""
    rows = sum(int(pg.scalar(MLFLOW_DB, "SELECT count(*) FROM metrics WHERE run_uuid = %s", (r,))) for r, _ in used)
    last_run, last_points = used[-1]
    history, page_token = [], None
    while True:
        query = {"run_id": last_run, "metric_key": shape.names[0], **({"page_token": page_token} if page_token else {})}
        page = http_json("GET", f"{url}/api/2.0/mlflow/metrics/get-history?" + urllib.parse.urlencode(query))
        history.extend(page.get("metrics", []))
        page_token = page.get("next_page_token")
        if not page_token:
            break
    steps_sent = last_points // shape.k
    return {
        "mlflow_metrics_rows": rows,
        "mlflow_get_history": {"metric": shape.names[0], "points": len(history), "expected": steps_sent},
        "mlflow_ok": len(history) == steps_sent,
    }


if __name__ == "__main__":
    _servers.run_bench(main)
