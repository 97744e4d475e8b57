"""Comparing runs: server time and bytes of one compare request (R runs x N steps of one metric,
downsampled on the server) against our old raw-row read and MLflow's own sampled bulk read.

The data set: R runs of N steps, each step one `metrics` event with K metrics (reward/mean, kl/mean with
a non-finite value every 97 steps, progress/samples, progress/tokens, then filler metrics). It goes in
through the real ingestion path in-process: `parse_batch` + `posttrain.telemetry.ingestion.events_ingest`, `--batch-steps`
events per call (MetricRow rows, the summary and the sealed column-store blocks), in a fresh database
`bench_compare`.

What is timed (median of `--repeats`, after one warm-up):

- ours in-process: Django's test Client, `GET /api/compare/?runs=<R ids>&names=reward/mean&max_points=M`
  (URL routing, session auth, the view, JSON rendering), split into the store read (`read_series`, of
  the blocks' overviews for runs with at least 32 x max_points points), read + M4 downsampling
  (`runs_series`), and the whole request; and the store read of every point, as before overviews;
- ours over HTTP: the same request to `uvicorn posttrain.asgi:application` (1 worker, a DRF token),
  from a keep-alive stdlib http.client connection, like MLflow below;
- baseline: the old raw path, `GET /api/runs/<id>/metrics/?names=reward/mean` for each run (reads every
  MetricRow and answers every point: no downsampling), in-process;
- MLflow (3.17.2, `mlflow server --workers 1` on the same Postgres): `GET /ajax-api/2.0/mlflow/metrics/
  get-history-bulk-interval?run_ids=...&metric_key=reward/mean&max_results=M`, the call its UI makes to
  chart runs. It samples M points per run evenly by row in SQL (no min/max: spikes between samples are
  lost). Its runs hold the same reward/mean values, logged with `runs/log-batch` (1000 per call).
  `--no-mlflow` leaves it out.

Bytes are the response body as sent (neither server compresses) and gzip level 6 of it (what a
compressing proxy would send). At the end the databases are dropped and both servers stopped.

    .venv/bin/python bench/compare.py [--runs 10] [--steps 100000] [--metrics 4] [--max-points 2000]
                                      [--repeats 7] [--batch-steps 1000] [--no-mlflow] [--pg-url URL]

Prints one JSON document on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers
from bench._machine import MachineLoad
from bench._servers import REPO, Server
from bench.ingest import (
    Postgres,
    bench_db,
    ensure_bench_venv,
    http_json,
    log_server_tails,
    mlflow_version,
    start_mlflow,
    start_ours,
)

OURS_DB, MLFLOW_DB = bench_db("bench_compare"), bench_db("bench_compare_mlflow")
METRIC = "reward/mean"
MLFLOW_BATCH = 1000  # MLflow's limit of metrics per log-batch
T0 = 1_700_000_000.0
STEP_S = 0.5


def log(message: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


def timed(fn: Callable[[], Any], repeats: int) -> tuple[list[float], Any]:
    fn()  # warm-up
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return times, result


# --- data ------------------------------------------------------------------------------------------


def reward_curve(run: int, steps: int) -> list[float]:
    """A learning curve with noise and rare spikes, different per run (deterministic)."""
    import numpy as np

    rng = np.random.default_rng(run)
    x = np.arange(steps)
    y = 0.2 + 0.6 * (1 - np.exp(-x / (steps / 4))) + rng.normal(0, 0.05, steps)
    spikes = rng.choice(steps, size=max(1, steps // 5000), replace=False)
    y[spikes] -= 1.0
    return y.round(6).tolist()


def metrics_events(run_id: str, first: int, rewards: list[float], n_metrics: int) -> list[dict[str, Any]]:
    events = []
    for step in range(first, first + len(rewards)):
        data: dict[str, Any] = {
            METRIC: rewards[step - first],
            "kl/mean": "nan" if step % 97 == 0 else round(0.01 + 1e-7 * step, 7),
            "progress/samples": 256 * (step + 1),
            "progress/tokens": 256 * 180 * (step + 1),
        }
        for i in range(max(0, n_metrics - len(data))):
            data[f"timing/phase_{i}"] = 1.0 + (step % 10) * 0.01
        events.append(
            {"run": run_id, "seq": step + 1, "type": "metrics", "step": step, "time": T0 + step * STEP_S, "data": data}
        )
    return events


# --- ours ------------------------------------------------------------------------------------------


def django_setup(pg: Postgres, workdir: Path) -> dict[str, str]:
    """Point this process at the fresh database (no Redis: the live channel stays in-process)."""
    for key in ("REDIS_URL", "CELERY_BROKER_URL"):
        os.environ.pop(key, None)
    os.environ.update(
        DATABASE_URL=pg.url(OURS_DB),
        POSTTRAIN_HOME=str(workdir / "posttrain-home"),
        POSTTRAIN_SECRET_KEY=secrets.token_urlsafe(40),
        OMP_NUM_THREADS="1",
        DJANGO_SETTINGS_MODULE="posttrain.settings",
    )
    sys.path.insert(0, str(REPO / "platform"))
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    from django.core.management import call_command
    from django.test.utils import setup_test_environment

    setup_test_environment()  # the test Client's host is allowed
    call_command("migrate", "--noinput", verbosity=0)
    return dict(os.environ)


def create_runs(n_runs: int) -> tuple[Any, str, list[str]]:
    from posttrain.accounts.services import token_get_or_create, user_create
    from posttrain.projects.models import Membership, default_project_id
    from posttrain.registry.models import Dataset, ModelAsset
    from posttrain.runs.models import Experiment, Run, RunState

    user = user_create("bench-researcher", secrets.token_urlsafe(16), "researcher")
    # A member of the default project, where the runs below are made.
    Membership.objects.create(project_id=default_project_id(), user=user, role="member")
    model = ModelAsset.objects.create(name="bench-compare", path="/nonexistent")
    data = Dataset.objects.create(
        name="bench-compare", sha256="0" * 64, format="jsonl", path="/nonexistent", size_bytes=0, row_count=0
    )
    experiment = Experiment.objects.create(name="bench compare", model=model, dataset=data, config={})
    # Running: each ends as an engine's run does, with its `succeeded` status event (ingest_ours).
    runs = [
        Run.objects.create(experiment=experiment, name=f"bench compare #{i}", state=RunState.RUNNING)
        for i in range(n_runs)
    ]
    return user, token_get_or_create(user).key, [str(run.pk) for run in runs]


def ingest_ours(
    run_ids: list[str], curves: list[list[float]], n_metrics: int, batch_steps: int, finish: bool = True
) -> dict[str, Any]:
    from posttrain.telemetry.event_schema import parse_batch
    from posttrain.telemetry.ingestion import events_ingest

    started = time.perf_counter()
    calls: list[float] = []
    for i, (run_id, curve) in enumerate(zip(run_ids, curves)):
        for first in range(0, len(curve), batch_steps):
            events = parse_batch(
                {"events": metrics_events(run_id, first, curve[first : first + batch_steps], n_metrics)}, run_id
            )
            t0 = time.perf_counter()
            events_ingest(run_id, events, touch=False)
            calls.append(time.perf_counter() - t0)
        if finish:  # the run's end, as the engine reports it: its short tail of points is sealed too
            end = {"run": run_id, "seq": len(curve) + 1, "type": "status", "step": None, "time": T0}
            events_ingest(run_id, parse_batch({"events": [{**end, "data": {"state": "succeeded"}}]}, run_id))
        log(f"ours: run {i + 1}/{len(run_ids)} ingested")
    total = sum(len(c) for c in curves)
    return {
        "events": total,
        "points": total * n_metrics,
        "wall_s": round(time.perf_counter() - started, 1),
        "events_ingest_s": round(sum(calls), 1),
        "events_ingest_ms_per_call_median": median_ms(calls),
    }


# --- MLflow ------------------------------------------------------------------------------------------


def load_mlflow(url: str, curves: list[list[float]]) -> tuple[list[str], dict[str, Any]]:
    experiment_id = http_json("POST", f"{url}/api/2.0/mlflow/experiments/create", {"name": "bench-compare"})[
        "experiment_id"
    ]
    started = time.perf_counter()
    run_ids = []
    for i, curve in enumerate(curves):
        run_id = http_json(
            "POST",
            f"{url}/api/2.0/mlflow/runs/create",
            {"experiment_id": experiment_id, "run_name": f"bench compare #{i}", "start_time": int(T0 * 1000)},
        )["run"]["info"]["run_id"]
        parsed = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=300)
        for first in range(0, len(curve), MLFLOW_BATCH):
            metrics = [
                {"key": METRIC, "value": value, "timestamp": int((T0 + step * STEP_S) * 1000), "step": step}
                for step, value in enumerate(curve[first : first + MLFLOW_BATCH], start=first)
            ]
            body = json.dumps({"run_id": run_id, "metrics": metrics}, separators=(",", ":"))
            conn.request("POST", "/api/2.0/mlflow/runs/log-batch", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            payload = response.read()
            if response.status != 200:
                raise RuntimeError(f"MLflow log-batch: HTTP {response.status} {payload[:300]!r}")
        conn.close()
        run_ids.append(run_id)
        log(f"mlflow: run {i + 1}/{len(curves)} logged")
    return run_ids, {"points": sum(len(c) for c in curves), "wall_s": round(time.perf_counter() - started, 1)}


# --- HTTP timing -------------------------------------------------------------------------------------


def http_get_timed(base_url: str, path: str, headers: dict[str, str], repeats: int) -> tuple[list[float], bytes]:
    parsed = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=300)
    body = b""

    def get() -> bytes:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        payload = response.read()
        if response.status != 200:
            raise RuntimeError(f"GET {path[:120]}: HTTP {response.status} {payload[:300]!r}")
        return payload

    try:
        times, body = timed(get, repeats)
    finally:
        conn.close()
    return times, body


def sizes(body: bytes) -> dict[str, int]:
    return {"bytes": len(body), "gzip_bytes": len(gzip.compress(body, compresslevel=6))}


# --- main ----------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--metrics", type=int, default=4, help="metrics per step (at least 4)")
    ap.add_argument("--max-points", type=int, default=2000, help="max_points of the compare request (MLflow: <= 2500)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--baseline-repeats", type=int, default=3)
    ap.add_argument("--batch-steps", type=int, default=1000, help="events per ingestion call")
    ap.add_argument("--no-mlflow", action="store_true", help="leave out the MLflow peer")
    ap.add_argument(
        "--running", action="store_true", help="leave the runs running (their last <1,024 points stay unsealed)"
    )
    ap.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432"))
    args = ap.parse_args()
    if args.metrics < 4 or not 1 <= args.max_points <= 2500:
        ap.error("--metrics >= 4 and 1 <= --max-points <= 2500 (MLflow's limit)")

    started = time.perf_counter()
    machine = MachineLoad()
    with_mlflow = not args.no_mlflow
    if with_mlflow:
        ensure_bench_venv()
    pg = Postgres(args.pg_url)
    workdir = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    servers: list[Server] = []
    try:
        pg.recreate(OURS_DB)
        if with_mlflow:
            pg.recreate(MLFLOW_DB)
            servers.append(mlflow := start_mlflow(pg, workdir, MLFLOW_DB))  # migrates its database while we ingest
        env = django_setup(pg, workdir)
        user, token, run_ids = create_runs(args.runs)
        curves = [reward_curve(i, args.steps) for i in range(args.runs)]
        log(f"ingesting {args.runs} runs x {args.steps} steps x {args.metrics} metrics (ours)")
        ours_load = ingest_ours(run_ids, curves, args.metrics, args.batch_steps, finish=not args.running)
        log(f"ours: ingested in {ours_load['wall_s']} s")

        from django.db import connection
        from django.test import Client

        from posttrain.runs.models import Run
        from posttrain.telemetry import series
        from posttrain.telemetry.models import MetricBlock, MetricRow

        with connection.cursor() as cursor:  # fresh statistics for the planner, as autovacuum would have
            cursor.execute("ANALYZE")
        client = Client()
        client.force_login(user)
        query = urllib.parse.urlencode({"runs": ",".join(run_ids), "names": METRIC, "max_points": args.max_points})
        url = f"/api/compare/?{query}"

        def compare_in_process() -> bytes:
            response = client.get(url)
            if response.status_code != 200:
                raise RuntimeError(f"compare: HTTP {response.status_code} {response.content[:300]!r}")
            return response.content

        runs = list(Run.objects.filter(pk__in=run_ids))
        overview = series.overview_pairs(runs, [METRIC], args.max_points)
        read_times, _ = timed(lambda: series.read_series(run_ids, [METRIC], overview=overview), args.repeats)
        whole_times, _ = timed(lambda: series.read_series(run_ids, [METRIC]), args.repeats)
        downsample_times, _ = timed(lambda: series.runs_series(runs, [METRIC], "step", args.max_points), args.repeats)
        request_times, body = timed(compare_in_process, args.repeats)
        answer = json.loads(body)
        curves_out = [r["series"][METRIC] for r in answer["runs"]]
        log(f"ours in-process: {median_ms(request_times)} ms per compare request")

        def old_path() -> int:
            total = 0
            for run_id in run_ids:
                response = client.get(f"/api/runs/{run_id}/metrics/", {"names": METRIC})
                if response.status_code != 200:
                    raise RuntimeError(f"metrics: HTTP {response.status_code}")
                total += len(response.content)
            return total

        baseline_times, baseline_bytes = timed(old_path, args.baseline_repeats)
        log(f"baseline (raw MetricRow reads, no downsampling): {median_ms(baseline_times)} ms")

        servers.append(ours := start_ours(env, workdir).wait_until_up("/login/"))
        http_times, http_body = http_get_timed(ours.url, url, {"Authorization": f"Token {token}"}, args.repeats)
        log(f"ours over HTTP: {median_ms(http_times)} ms")

        results: dict[str, Any] = {
            "ours": {
                "request": "GET " + url.split("?")[0] + f"?runs=<{args.runs} ids>&names={METRIC}"
                f"&max_points={args.max_points}",
                "in_process_ms": median_ms(request_times),
                "in_process_ms_per_repeat": [round(t * 1000, 2) for t in request_times],
                "of_which_store_read_ms": median_ms(read_times),
                "store_reads_overviews_of_runs": len(overview),
                "store_read_of_every_point_ms": median_ms(whole_times),  # what the read was before overviews
                "of_which_read_and_downsample_ms": median_ms(downsample_times),
                "over_http_ms": median_ms(http_times),
                **sizes(body),
                "points_per_run_returned": [len(c["x"]) for c in curves_out],
                "downsampling": "M4 (first, min, max, last per x bucket)",
            },
            "baseline_raw_metricrow_reads": {
                "request": f"GET /api/runs/<id>/metrics/?names={METRIC} for each of the {args.runs} runs (every point)",
                "in_process_ms": median_ms(baseline_times),
                "bytes": baseline_bytes,
            },
        }

        verification = {
            "ours_points_per_run": [c["points"] for c in curves_out],
            "ours_first_last_steps": [[c["step"][0], c["step"][-1]] for c in curves_out],
            "ours_spikes_kept": [min(c["y"]) == min(curve) for c, curve in zip(curves_out, curves)],
            "ours_http_body_equals_in_process": json.loads(http_body) == answer,
        }
        ok = (
            all(p == args.steps for p in verification["ours_points_per_run"])
            and all(fl == [0, args.steps - 1] for fl in verification["ours_first_last_steps"])
            and all(verification["ours_spikes_kept"])
            and verification["ours_http_body_equals_in_process"]
            and all(len(c["x"]) <= args.max_points for c in curves_out)
        )

        mlflow_load = None
        if with_mlflow:
            mlflow_url = mlflow.wait_until_up("/health", 300).url
            mlflow_runs, mlflow_load = load_mlflow(mlflow_url, curves)
            ml_query = urllib.parse.urlencode(
                [("run_ids", r) for r in mlflow_runs] + [("metric_key", METRIC), ("max_results", args.max_points)]
            )
            ml_path = f"/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval?{ml_query}"
            ml_times, ml_body = http_get_timed(mlflow_url, ml_path, {}, args.repeats)
            ml_metrics = json.loads(ml_body).get("metrics", [])
            per_run = {r: [m for m in ml_metrics if m["run_id"] == r] for r in mlflow_runs}
            log(f"mlflow over HTTP: {median_ms(ml_times)} ms")
            results["mlflow"] = {
                "request": f"GET /ajax-api/2.0/mlflow/metrics/get-history-bulk-interval?run_ids=<{args.runs} ids>"
                f"&metric_key={METRIC}&max_results={args.max_points}",
                "over_http_ms": median_ms(ml_times),
                "over_http_ms_per_repeat": [round(t * 1000, 2) for t in ml_times],
                **sizes(ml_body),
                "points_per_run_returned": [len(v) for v in per_run.values()],
                "downsampling": "even sampling by row in SQL (NTILE/ROW_NUMBER), first and last kept",
            }
            results["ratio_over_http_mlflow_over_ours"] = round(
                statistics.median(ml_times) / statistics.median(http_times), 2
            )
            verification["mlflow_spikes_kept"] = [
                min(m["value"] for m in per_run[r]) == min(curve) for r, curve in zip(mlflow_runs, curves)
            ]
            ok = ok and all(len(v) > 0 for v in per_run.values())

        doc = {
            "bench": "compare",
            "what": f"one compare request for {args.runs} runs x {args.steps} steps of {METRIC}: server time and bytes",
            "goal_ms": 300,
            "config": {
                "runs": args.runs,
                "steps": args.steps,
                "metrics_per_step": args.metrics,
                "max_points": args.max_points,
                "repeats": args.repeats,
                "batch_steps": args.batch_steps,
                "block_points": series.BLOCK_POINTS,
                "ingestion": "in-process parse_batch + events_ingest (the API's path without HTTP)",
                "stored": {"metric_rows": MetricRow.objects.count(), "metric_blocks": MetricBlock.objects.count()},
            },
            "versions": {
                "postgres": pg.scalar("postgres", "SHOW server_version"),
                "python": sys.version.split()[0],
                **({"mlflow": mlflow_version()} if with_mlflow else {}),
            },
            "load": {"ours": ours_load, **({"mlflow": mlflow_load} if mlflow_load else {})},
            "results": results,
            "verification": {**verification, "ok": ok},
            "total_s": round(time.perf_counter() - started, 1),
            "machine": machine.report(),
        }
        print(json.dumps(doc, indent=2))
        return 0 if ok else 1
    except Exception:
        log_server_tails(servers)
        raise
    finally:
        for server in reversed(servers):
            server.stop()
        try:
            from django.db import connections

            connections.close_all()
        except Exception:
            pass
        for db in (OURS_DB, MLFLOW_DB) if with_mlflow else (OURS_DB,):
            try:
                pg.drop(db)
            except Exception as exc:
                log(f"could not drop {db}: {exc}")
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    _servers.run_bench(main)
