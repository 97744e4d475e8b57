"""Postgres stopped for 10 s mid-run and started again: meanwhile the web answers 503 with Retry-After
(never a 500), the engine and the SDK keep their events and send them once it is back, and the worker
reconnects by itself. The stack runs on a private cluster (tests/faults/private_postgres.py):
the system Postgres is everyone else's."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from tests.faults.invariants import assert_nothing_left_running
from tests.faults.private_postgres import SEEDED_PASSPHRASE, PrivatePostgres, migrate_and_seed
from tests.faults.servers import FAULT_STACK_ENV, PrivateRedis
from tests.support.api import (
    Api,
    assert_rollout_files_match,
    create_experiment,
    launch,
    run_config,
    start_simulated_run,
)
from tests.support.stack import PlatformStack, platform_stack

pytestmark = [pytest.mark.slow]

OUTAGE_S = 10.0
SUCCEEDED = "engine finished every step"


@dataclass
class OutageStack:
    stack: PlatformStack
    postgres: PrivatePostgres
    api: Api
    registry: dict[str, SimpleNamespace]


@pytest.fixture(scope="module")
def outage(ray_head, demo_assets, private_redis: PrivateRedis, tmp_path_factory) -> Iterator[OutageStack]:
    postgres = PrivatePostgres()
    try:
        postgres.init()
        postgres.start()
        postgres.create_database()
        seeded = migrate_and_seed(postgres.url(), demo_assets)
        broker = private_redis.url.rsplit("/", 1)[0] + "/1"  # not the package stack's queue
        env = {**FAULT_STACK_ENV, "REDIS_URL": broker, "CELERY_BROKER_URL": broker}
        home = tmp_path_factory.mktemp("postgres-outage-stack")
        with platform_stack(ray_head, home, postgres.url(), extra_env=env) as stack:
            registry = {name: SimpleNamespace(pk=seeded[name]) for name in ("model", "dataset", "exact")}
            yield OutageStack(stack, postgres, Api(stack.web.url, seeded["token"]), registry)
    finally:
        postgres.remove()


def signed_in(base: str) -> requests.Session:
    """A browser session of the seeded researcher (pages read the session, so the database, on each request)."""
    browser = requests.Session()
    browser.get(f"{base}/login/", timeout=30)
    form = {"username": "ada", "password": SEEDED_PASSPHRASE, "csrfmiddlewaretoken": browser.cookies["csrftoken"]}
    response = browser.post(f"{base}/login/", data=form, headers={"Referer": f"{base}/login/"}, timeout=30)
    assert response.ok and "sessionid" in browser.cookies, response.text[:500]
    return browser


def answers_while_down(api: Api, browser: requests.Session, run_id: str, seconds: float) -> set[tuple[str, int, str]]:
    """What people get meanwhile, every half second: (what, status, Retry-After) of the run over the API,
    its page and its live stream."""
    answers = set()
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for what, session, path in (
            ("api", api.session, f"/api/runs/{run_id}/"),
            ("page", browser, f"/runs/{run_id}/"),
            ("stream", api.session, f"/api/runs/{run_id}/stream/"),
        ):
            with session.get(f"{api.base}{path}", timeout=30, stream=True, allow_redirects=False) as response:
                answers.add((what, response.status_code, response.headers.get("Retry-After", "")))
        time.sleep(0.5)
    return answers


def wait_for_a_reconcile_after(worker_log: Path, offset: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with worker_log.open() as log:
            log.seek(offset)
            if any("workers.runs_reconcile[" in line and "succeeded" in line for line in log):
                return
        time.sleep(0.2)
    raise AssertionError(
        f"no reconcile succeeded within {timeout_s}s of the restart:\n{worker_log.read_text()[-3000:]}"
    )


def assert_stored_once_each(postgres: PrivatePostgres, run_id: str, events: list[dict], rollouts_dir: Path) -> None:
    """The private database holds exactly `events` (the run's events.jsonl) of the run, each seq once, and
    the rollout store (`rollouts_dir`) every file its samples events announce."""
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    ((last_seq,),) = postgres.rows("SELECT last_seq FROM runs_run WHERE id = %s", (run_id,))
    assert last_seq == len(events)
    for kind, table in (("metrics", "telemetry_metricrow"), ("log", "telemetry_runlog")):
        stored = [seq for (seq,) in postgres.rows(f"SELECT seq FROM {table} WHERE run_id = %s ORDER BY seq", (run_id,))]
        assert stored == [e["seq"] for e in events if e["type"] == kind], kind
    announced = [
        (e["step"], e["data"]["file"], e["data"]["rows"], e["data"]["sha256"]) for e in events if e["type"] == "samples"
    ]
    indexed = postgres.rows(
        "SELECT step, name, rows, sha256 FROM telemetry_rolloutfile WHERE run_id = %s ORDER BY seq", (run_id,)
    )
    assert [tuple(row) for row in indexed] == announced
    assert_rollout_files_match(rollouts_dir, announced)


def test_postgres_stopped_for_10_s_answers_503_loses_no_event_and_the_worker_reconnects(outage, tmp_path):
    from posttrain_sdk.event_log import read_events

    api, stack, postgres = outage.api, outage.stack, outage.postgres
    # Long enough (~20 s alone) to outlast the SDK's start, the sign-in and the 10-second outage: 120 steps ended
    # before the outage under a loaded suite.
    config = run_config(400)
    experiment = create_experiment(api, outage.registry, "postgres outage", config, rewards=(("exact", 1.0),))
    run = launch(api, experiment)
    api.wait_for(run["id"], lambda r: r["state"] == "running" and (r["last_step"] or 0) >= 1, what="a step")
    sdk = start_simulated_run(api, tmp_path, "sdk during the outage", steps=300, rate=20.0)
    sdk_run_id = json.loads(sdk.stdout.readline())["run"]

    browser = signed_in(api.base)
    postgres.stop()
    down_from = time.time()
    answers = answers_while_down(api, browser, run["id"], OUTAGE_S)
    down_until = time.time()
    postgres.start()
    restarted_at_byte = stack.worker_log.stat().st_size

    assert answers == {("api", 503, "5"), ("page", 503, "5"), ("stream", 503, "5")}, answers
    assert sdk.wait(timeout=180) == 0, sdk.stdout.read()
    run = api.wait_until_finished(run["id"])
    assert (run["state"], run["state_reason"]) == ("succeeded", SUCCEEDED), run["state_reason"]
    engine_events = read_events(Path(run["resolved_config"]["logging"]["run_dir"]) / "events.jsonl")
    written_while_down = [e for e in engine_events if down_from < e["time"] < down_until]
    assert written_while_down, "the engine wrote nothing during the outage: the fault missed the run"
    assert_stored_once_each(postgres, run["id"], engine_events, Path(run["resolved_config"]["logging"]["rollouts_dir"]))
    # The SDK's files went up through the web process (uploads refused with 503 while the database was down
    # are retried like its events): they are in the platform's store.
    sdk_events = read_events(tmp_path / sdk_run_id / "events.jsonl")
    assert_stored_once_each(postgres, sdk_run_id, sdk_events, stack.storage / "runs" / sdk_run_id / "rollouts")
    assert_nothing_left_running(stack, run)

    # The same worker process reconnected by itself: its periodic reconcile (database reads and writes)
    # failed while Postgres was down and succeeds again.
    assert stack.worker.poll() is None, "the worker died with the database"
    wait_for_a_reconcile_after(stack.worker_log, restarted_at_byte)
    errors = [line for line in stack.web.log().splitlines() if '" 500 ' in line]
    assert not errors, "\n".join(errors)
