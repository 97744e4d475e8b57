"""The scheduler on a real two-node Ray cluster: a head and a second node (`ray start --address`), both on
this machine with one CPU each and the same storage, behind one RAY_ADDRESS. Admission counts both nodes,
Ray places each admitted run's driver on whichever node has its CPU, and a third run waits until one ends."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.api import admitted_at, create_experiment, run_config
from tests.support.stack import (
    RAY_STOP_GRACE_S,
    VENV_BIN,
    free_port,
    platform_stack,
    postgres_url,
    ray_get_json,
    ray_node_env,
    stop_process_group,
    wait_for_http,
)
from tests.support.stack_fixtures import api, check_after_test, demo_assets, registry  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NODE_START_S = 180
NODE_JOIN_ATTEMPTS = 3


def ray_node(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(VENV_BIN / "ray"), "start", "--block", "--num-cpus", "1", "--disable-usage-stats", *args],
        env=ray_node_env(),  # token authentication, the head and the joining node alike
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def second_node(gcs_port: int, log: Path) -> subprocess.Popen:
    """A node joined to the head's GCS; a second raylet on this host needs ports of its own."""
    return ray_node(
        [
            f"--address=127.0.0.1:{gcs_port}",
            "--node-manager-port",
            str(free_port()),
            "--object-manager-port",
            str(free_port()),
            "--dashboard-agent-listen-port",
            str(free_port()),
            "--min-worker-port",
            "20000",
            "--max-worker-port",
            "29999",
        ],
        log,
    )


def alive_nodes(address: str) -> list:
    from workers.ray_cluster import cluster_view

    return cluster_view(address).nodes


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> Iterator[str]:
    """The head (its dashboard is the cluster's RAY_ADDRESS) and a second node joined to its GCS."""
    logs = tmp_path_factory.mktemp("ray-cluster")
    gcs_port, dashboard_port = free_port(), free_port()
    head = ray_node(
        [
            "--head",
            "--port",
            str(gcs_port),
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(dashboard_port),
            "--dashboard-agent-listen-port",
            str(free_port()),
            "--temp-dir",
            f"/tmp/pt-ray-2n-{os.getpid()}",  # short: Ray's unix sockets live under it
        ],
        logs / "head.log",
    )
    nodes = [head]
    address = f"http://127.0.0.1:{dashboard_port}"
    try:
        wait_for_http(f"{address}/api/version", timeout_s=NODE_START_S, process=head)
        deadline = time.monotonic() + NODE_START_S
        for attempt in range(NODE_JOIN_ATTEMPTS):
            nodes.append(second_node(gcs_port, logs / f"node-{attempt}.log"))
            while len(alive_nodes(address)) < 2 and nodes[-1].poll() is None and time.monotonic() < deadline:
                time.sleep(1)
            if len(alive_nodes(address)) == 2:
                break
            # On a loaded machine the raylet may miss Ray's fixed 30 s registration window and exit: try again.
        else:
            pytest.fail(f"the second Ray node did not join:\n{(logs / f'node-{attempt}.log').read_text()[-3000:]}")
        yield address
    finally:
        for node in reversed(nodes):
            stop_process_group(node, timeout_s=RAY_STOP_GRACE_S)


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, two_nodes, tmp_path_factory):
    from django.db import connection

    with platform_stack(
        two_nodes, tmp_path_factory.mktemp("two-node-stack"), postgres_url(connection.settings_dict)
    ) as s:
        yield s


@pytest.fixture(autouse=True)
def _after_each_test(stack, api) -> Iterator[None]:  # noqa: F811  (the fixture imported above)
    """tests/support/stack_fixtures.py's check_after_test after each test: no request was a 500, and no run
    is left going into the next test."""
    yield
    check_after_test(stack, api)


def driver_node(ray_address: str, run_id: str) -> str:
    """The node Ray placed the run's driver on (the Jobs API's job details)."""
    job = ray_get_json(f"{ray_address}/api/jobs/{run_id}")
    return job["driver_node_id"]


def test_runs_are_placed_on_either_node_and_the_queue_counts_both(api, registry, stack):  # noqa: F811
    # The first two hold a CPU each until the test cancels them, so the queue is read while they surely run
    # (runs of a fixed length, 8 steps and then 300, ended between two polls of a test on a busy machine).
    holders = create_experiment(api, registry, "one cpu each, until cancelled", run_config(100_000))
    short = create_experiment(api, registry, "one cpu, short", run_config(8))
    runs = [api.post(f"/api/experiments/{holders['id']}/launch/", {"seed": seed}) for seed in (1, 2)]
    runs.append(api.post(f"/api/experiments/{short['id']}/launch/", {"seed": 3}))

    # Two fit, one per node; the third waits for a CPU of either.
    try:
        waiting = api.wait_for(runs[2]["id"], lambda r: r["queue_position"] == 1, what="first in the queue")
    except AssertionError as failed:  # say what the scheduler saw: a node missing, or one run held both nodes' room
        raise AssertionError(f"{failed}\nthe queue: {api.get('/api/queue/')}") from None
    assert waiting["state"] == "queued" and waiting["queue_reason"] == "needs 1 CPU, 0 free"
    started = [api.wait_for(r["id"], lambda r: r["state"] == "running", what="running") for r in runs[:2]]
    queue = api.get("/api/queue/")
    assert sorted(n["total"]["CPU"] for n in queue["cluster"]["nodes"]) == [1.0, 1.0]
    assert sorted(n["head"] for n in queue["cluster"]["nodes"]) == [False, True]
    assert {r["id"] for r in queue["running"]} == {r["id"] for r in started}
    assert driver_node(stack.ray, started[0]["id"]) != driver_node(stack.ray, started[1]["id"])
    assert api.get(f"/api/runs/{runs[2]['id']}/")["state"] == "queued"

    # A CPU comes free on one node: the waiting run takes it.
    api.post(f"/api/runs/{runs[0]['id']}/cancel/", expect=200)
    cancelled = api.wait_until_finished(runs[0]["id"], timeout_s=120)
    third = api.wait_until_finished(runs[2]["id"], timeout_s=300)
    api.post(f"/api/runs/{runs[1]['id']}/cancel/", expect=200)
    assert (cancelled["state"], third["state"]) == ("cancelled", "succeeded"), third["state_reason"]
    assert cancelled["finished_at"] <= admitted_at(api, runs[2]["id"])
    assert driver_node(stack.ray, runs[2]["id"]) in {n["node_id"] for n in queue["cluster"]["nodes"]}
    assert api.wait_until_finished(runs[1]["id"], timeout_s=120)["state"] == "cancelled"
