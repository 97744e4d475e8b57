"""The web process against the largest rollout files and the largest campaign: what each read route costs it
(peak memory, answer time, answer bytes) and what creating a campaign over a large run costs, against the
bounds (posttrain_sdk.rollout_files, posttrain.telemetry.rollouts.SHOWN, docs/SECURITY.md "Rollout files and
campaign sampling").

A fresh Postgres database; uvicorn serves it (one worker) over a rollout store this bench fills:

- `bounds`: one step whose rollouts sit at the upload bounds (a rollout of MAX_ROLLOUT_TOKENS token pieces
  and per-token values, one of MAX_ERRORS errors of MAX_ERROR_BYTES, a response of MAX_TEXT_BYTES), uploaded
  through PUT .../upload (the largest file the route accepts, checked) and announced;
- `attack`: the files found by attacking the demo, written straight into the store as an old upload would
  have left them (one rollout of --attack-pieces token pieces, one of --attack-errors errors);
- `large`: a run of --steps x --rollouts rollouts written with pyarrow (1.5M by default), indexed.

Then, one request at a time, the web process's peak resident memory (VmHWM, /proc) before and after, the
time and the answer's size: the samples page (500 rows), the per-token view, compare's prompts and samples,
the rollout listing, and campaign creation over the large run in the request (the inline limit raised) and as
a worker builds it (campaign_build, in this process: its peak memory and time).

    .venv/bin/python bench/rollout_bounds.py [--steps 730] [--rollouts 2048] [--pg-url postgres://postgres@127.0.0.1:5432]
    .venv/bin/python bench/rollout_bounds.py --smoke      # 3 x 64 rollouts, small attack files (seconds)

Prints one JSON document on stdout (progress on stderr), with the machine's load (`uptime`'s averages).
Run it alone on a quiet machine: the figures are memory and time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK
from bench import _servers
from bench._machine import MachineLoad
from bench._review import django_setup, fresh_database, tear_down

DB = "bench_rollout_bounds"
PASSWORD = "a-long-bench-passphrase"


def log(message: str) -> None:
    print(f"[rollout-bounds {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set so far (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


# --- the store ----------------------------------------------------------------------------------------------


def a_run(name: str) -> Any:
    from posttrain.core.run_tokens import ingest_token, token_hash
    from posttrain.registry.models import Dataset, ModelAsset
    from posttrain.runs.models import Experiment, Run, RunState

    model, _ = ModelAsset.objects.get_or_create(name="bench-bounds", defaults={"path": "/nonexistent"})
    data, _ = Dataset.objects.get_or_create(
        name="bench-bounds",
        defaults={"sha256": "0" * 64, "format": "jsonl", "path": "/nonexistent", "size_bytes": 0, "row_count": 0},
    )
    experiment, _ = Experiment.objects.get_or_create(
        name="bench bounds", defaults={"model": model, "dataset": data, "config": {}}
    )
    run_id = uuid.uuid4()
    return Run.objects.create(
        id=run_id,
        experiment=experiment,
        name=name,
        state=RunState.RUNNING,
        ingest_token_hash=token_hash(ingest_token(run_id)),  # the upload's bearer token
    )


def announce(run: Any, seq: int, info: Any) -> None:
    from posttrain.telemetry.ingestion import events_ingest

    event = {
        "run": str(run.id),
        "seq": seq,
        "type": "samples",
        "step": info.step,
        "time": 0.0,
        "data": info.event_data(),
    }
    events_ingest(run.id, [event])


def record(index: int, **fields: Any) -> dict[str, Any]:
    return {
        "index": index,
        "group": index // 8,
        "prompt": f"prompt {index // 8}",
        "response": f"response {index}",
        "label": "42",
        "reward": 0.5,
        "components": {"exact": 0.5},
        "advantage": 0.0,
        "length": 4,
        "finish_reason": "stop",
        "kept": True,
        **fields,
    }


def bounds_file(step: int, scale: float) -> bytes:
    """One step at the upload bounds (scaled down for a smoke run)."""
    from posttrain_sdk import rollout_files as rf

    tokens = int(rf.MAX_ROLLOUT_TOKENS * scale)
    records = [
        record(0),
        record(1, errors=["e" * int(rf.MAX_ERROR_BYTES * scale)] * rf.MAX_ERRORS),
        record(2, response="r" * int(rf.MAX_TEXT_BYTES * scale)),
    ]
    columns = {
        "token_text": [["p"], ["p"], ["tok"] * tokens],
        "entropy": [[0.5], [0.5], [0.25] * tokens],
        "rollout_logprob": [[-1.0], [-1.0], [-0.5] * tokens],
    }
    return rf.encode(rf.rows_table(records, step, columns))


def write_attack(run: Any, pieces: int, errors: int) -> None:
    """The attack's files, as an unchecked upload left them: one rollout of `pieces` token pieces (step 1), one
    of `errors` errors (step 2)."""
    from posttrain.telemetry.rollouts import rollout_folder
    from posttrain_sdk import rollout_files as rf

    folder = rollout_folder(run.id)
    tables = {
        1: rf.rows_table([record(0)], 1, {"token_text": [["x"] * pieces], "entropy": [[0.1] * pieces]}),
        2: rf.rows_table([record(0, errors=["boom"] * errors)], 2),
    }
    for seq, (step, table) in enumerate(tables.items(), start=1):
        announce(run, seq, rf.write_step(folder, table, step=step))


def write_large(run: Any, steps: int, rollouts: int) -> None:
    """`steps` x `rollouts` short rollouts, built column by column with pyarrow (no Python row per rollout)."""
    import pyarrow as pa

    from posttrain.telemetry.rollouts import rollout_folder
    from posttrain_sdk import rollout_files as rf

    schema = rf.schema()
    rng = np.random.default_rng(0)
    index = np.arange(rollouts, dtype=np.int32)
    prompts = pa.array([f"prompt {g}" for g in range(rollouts // 8 + 1)])
    for step in range(1, steps + 1):
        columns = {
            "step": pa.array(np.full(rollouts, step, dtype=np.int32)),
            "index": pa.array(index),
            "group": pa.array(index // 8),
            "prompt": prompts.take(pa.array(index // 8)),
            "response": pa.array([f"answer {i % 97}" for i in range(rollouts)]),
            "label": pa.array(["42"] * rollouts),
            "reward": pa.array(rng.random(rollouts)),
            "components": pa.array(['{"exact": 1.0}'] * rollouts),
            "advantage": pa.array(rng.normal(size=rollouts)),
            "length": pa.array(np.full(rollouts, 4, dtype=np.int32)),
            "finish_reason": pa.array(["stop"] * rollouts),
            "kept": pa.array(np.ones(rollouts, dtype=bool)),
        }
        arrays = [columns[f.name] if f.name in columns else pa.nulls(rollouts, f.type) for f in schema]
        table = pa.Table.from_arrays(arrays, schema=schema)
        announce(run, step, rf.write_step(rollout_folder(run.id), table, step=step))
        if step % 100 == 0:
            log(f"large run: {step}/{steps} steps written")


# --- the requests -----------------------------------------------------------------------------------------------


class Web:
    def __init__(self, server: _servers.Server, token: str):
        self.server, self.token = server, token

    def call(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json") -> dict:
        """One request: its status, seconds, answer bytes, and the web process's peak memory before and after."""
        before = peak_rss_mib(self.server.pid)
        headers = {"Authorization": self.token, "Content-Type": content_type}
        request = urllib.request.Request(f"{self.server.url}{path}", data=body, method=method, headers=headers)
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=1800) as response:
                status, data = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, data = exc.code, exc.read()
        seconds = time.perf_counter() - started
        return {
            "status": status,
            "s": round(seconds, 3),
            "answer_bytes": len(data),
            "web_peak_rss_mib_before": before,
            "web_peak_rss_mib_after": peak_rss_mib(self.server.pid),
            "body": json.loads(data) if data[:1] in (b"{", b"[") else None,
        }


def measured(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "body"}


def read_routes(web: Web, bounds: Any, attack: Any, large: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, run in (("bounds", bounds), ("attack", attack)):
        out[f"{name}_samples_page"] = measured(web.call("GET", f"/api/runs/{run.id}/samples/?limit=500"))
        out[f"{name}_sample_tokens"] = measured(
            web.call("GET", f"/api/runs/{run.id}/sample-tokens/?step=1&index={2 if name == 'bounds' else 0}")
        )
    out["attack_errors_page"] = measured(web.call("GET", f"/api/runs/{attack.id}/samples/?step=2"))
    out["large_samples_page"] = measured(web.call("GET", f"/api/runs/{large.id}/samples/?limit=500"))
    out["large_reward_filter_page"] = measured(web.call("GET", f"/api/runs/{large.id}/samples/?min_reward=0.999"))
    out["large_rollout_listing"] = measured(web.call("GET", f"/api/runs/{large.id}/rollouts/"))
    runs = f"{bounds.id},{attack.id}"
    out["compare_prompts"] = measured(web.call("GET", f"/api/compare/prompts/?runs={runs}"))
    out["compare_samples"] = measured(web.call("GET", f"/api/compare/samples/?runs={runs}&prompt=prompt%200"))
    return out


def campaign_body(run: Any, annotator: str, k: int) -> bytes:
    return json.dumps(
        {
            "name": "bench bounds",
            "kind": "single",
            "questions": [{"key": "ok", "kind": "pass_fail", "label": "OK?"}],
            "source": {"runs": [str(run.id)], "rule": "lowest_reward", "k": k, "seed": 1},
            "annotators": [annotator],
        }
    ).encode()


def built_on_a_worker(campaign_id: int) -> dict[str, Any]:
    """campaign_build in this process (as a worker runs it): seconds, this process's peak memory growth, state."""
    from posttrain.review.models import Campaign
    from posttrain.review.services import campaign_build

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    campaign_build(campaign_id)
    seconds = time.perf_counter() - started
    campaign = Campaign.objects.get(pk=campaign_id)
    return {
        "s": round(seconds, 3),
        "process_peak_rss_mib_before": round(before, 1),
        "process_peak_rss_mib_after": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "state": campaign.state,
        "items": campaign.items.count(),
    }


# --- main -----------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--steps", type=int, default=730, help="steps of the large run (730 x 2048: 1.5M rollouts)")
    parser.add_argument("--rollouts", type=int, default=2048, help="rollouts per step of the large run")
    parser.add_argument("--attack-pieces", type=int, default=15_000_000, help="token pieces of the attack's rollout")
    parser.add_argument("--attack-errors", type=int, default=7_000_000, help="errors of the attack's other rollout")
    parser.add_argument("--k", type=int, default=2, help="campaign items per step")
    parser.add_argument("--smoke", action="store_true", help="3 x 64 rollouts, attack lists of 20,000 (seconds)")
    args = parser.parse_args()
    scale = 1.0
    if args.smoke:
        args.steps, args.rollouts, args.attack_pieces, args.attack_errors, scale = 3, 64, 20_000, 20_000, 0.01
    machine = MachineLoad()
    db = DB + os.environ.get("BENCH_DB_SUFFIX", "")
    workdir = Path(tempfile.mkdtemp(prefix="rollout-bounds-"))
    os.environ["POSTTRAIN_ROLLOUT_STORE"] = str(workdir / "store")
    server = None
    try:
        env = django_setup(fresh_database(args.pg_url, db), workdir, redis_url=None)
        from rest_framework.authtoken.models import Token

        from posttrain.accounts.services import user_create
        from posttrain.core import dispatch
        from posttrain.core.run_tokens import ingest_token
        from posttrain_sdk import rollout_files as rf

        dispatch.run_task = lambda *args: None  # no worker: the search index is not what is measured
        from posttrain.projects.models import Membership, Project, default_project_id

        researcher = user_create("bench-researcher", PASSWORD, "researcher")
        # A maintainer of the default project, where the runs below are made (campaigns over them too).
        Membership.objects.create(project_id=default_project_id(), user=researcher, role="maintainer")
        user_create("bench-annotator", PASSWORD, "annotator")
        token = "Token " + Token.objects.create(user=researcher).key
        bounds, attack, large = a_run("bounds"), a_run("attack"), a_run("large")
        log("writing the attack's files and the large run")
        write_attack(attack, args.attack_pieces, args.attack_errors)
        write_large(large, args.steps, args.rollouts)
        env = {**env, "POSTTRAIN_REVIEW_CAMPAIGN_INLINE_ROLLOUTS": str(args.steps * args.rollouts)}
        server = _servers.start_uvicorn(env, workdir / "uvicorn.log").wait_until_up("/api/health/", 120)
        web = Web(server, token)
        started_rss = peak_rss_mib(server.pid)

        log("uploading the file at the bounds")
        body = bounds_file(1, scale)
        upload = Web(server, f"Bearer {ingest_token(bounds.id)}").call(
            "PUT", f"/api/runs/{bounds.id}/rollouts/{rf.file_name(1)}/upload", body, "application/vnd.apache.parquet"
        )
        announce(bounds, 1, rf.FileInfo(rf.file_name(1), 1, 0, 3, len(body), "", {}))
        log("the read routes")
        reads = read_routes(web, bounds, attack, large)
        log("campaign creation over the large run")
        inline = web.call("POST", "/api/review/campaigns/", campaign_body(large, "bench-annotator", args.k))
        from django.conf import settings

        settings.REVIEW_CAMPAIGN_INLINE_MAX_ROLLOUTS = 0  # this process creates it building, and builds it
        from posttrain.review import services as review
        from posttrain.review.services import campaigns as review_campaigns

        # no worker here: this process builds it below (task_send is looked up where the build is queued)
        review_campaigns.task_send = lambda *args, **kwargs: None
        queued = review.campaign_create(
            name="bench bounds (worker)",
            kind="single",
            questions=[{"key": "ok", "kind": "pass_fail", "label": "OK?"}],
            source={"runs": [str(large.id)], "rule": "lowest_reward", "k": args.k, "seed": 1},
            project=Project.objects.get(pk=default_project_id()),
            user=researcher,
        )
        worker = built_on_a_worker(queued.pk)
        document = {
            "config": {
                "steps": args.steps,
                "rollouts_per_step": args.rollouts,
                "large_run_rollouts": args.steps * args.rollouts,
                "attack_pieces": args.attack_pieces,
                "attack_errors": args.attack_errors,
                "k": args.k,
                "smoke": args.smoke,
            },
            "bounds": {
                "max_rollout_tokens": rf.MAX_ROLLOUT_TOKENS,
                "max_text_bytes": rf.MAX_TEXT_BYTES,
                "max_errors": rf.MAX_ERRORS,
                "max_row_bytes": rf.MAX_ROW_BYTES,
                "max_rows": rf.MAX_ROWS,
                "bounds_file_bytes": len(body),
            },
            "web_peak_rss_mib_at_start": started_rss,
            "upload_at_bounds": measured(upload),
            "reads": reads,
            "campaign_in_request": measured(inline),
            "campaign_in_request_items": (inline["body"] or {}).get("item_count"),
            "campaign_on_worker": worker,
            "web_peak_rss_mib_at_end": peak_rss_mib(server.pid),
            "machine": machine.report(),
        }
    finally:
        tear_down(args.pg_url, db, workdir, [server], log)
    print(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    _servers.run_bench(main)
