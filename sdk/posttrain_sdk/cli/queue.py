"""`posttrain queue`: the scheduler's queue, its running runs and the cluster's nodes."""

from __future__ import annotations

from typing import Any

import click

from posttrain_sdk.cli.common import _client, _emit_json, _short, _table, json_option, out, reports_errors, wide_option
from posttrain_sdk.cli.root import main


@main.group()
def queue() -> None:
    """The scheduler's queue."""


def _resources(value: dict[str, Any]) -> str:
    return ", ".join(f"{value.get(k, 0):g} {k}" for k in ("CPU", "GPU") if value.get(k) or k == "CPU")


@queue.command("ls")
@wide_option
@json_option
@click.pass_context
@reports_errors
def queue_ls(ctx, wide: bool, as_json: bool) -> None:
    """Waiting runs in the order they start, why each waits, the running runs and the cluster's nodes."""
    found = _client(ctx).runs.queue()
    if as_json:
        _emit_json(found)
        return
    waiting = [
        (
            r["queue_position"] or "held",
            _short(r["id"], wide),
            r["name"],
            r["owner"] or "—",
            r["priority"],
            _resources(r["resources"]),
            r["reason"],
            r["estimated_start"] or "—",
        )
        for r in found["waiting"]
    ]
    out.print(
        _table(
            ["#", "run", "name", "owner", "priority", "needs", "why it waits", "estimated start"],
            waiting,
            title="Waiting",
        )
    )
    running = [
        (
            _short(r["id"], wide),
            r["name"],
            r["state"],
            r["owner"] or "—",
            r["priority"],
            _resources(r["grant"]),
            f"{r['last_step'] or 0}/{r['total_steps'] or '?'}",
        )
        for r in found["running"]
    ]
    out.print(_table(["run", "name", "state", "owner", "priority", "granted", "steps"], running, title="Running"))
    nodes = [
        (
            n["node_id"] if wide else n["node_id"][:12],
            n["address"],
            f"{n['free']['CPU']:g}/{n['total']['CPU']:g}",
            f"{n['free']['GPU']:g}/{n['total']['GPU']:g}",
        )
        for n in found["cluster"]["nodes"]
    ]
    out.print(_table(["node", "address", "CPUs free/total", "GPUs free/total"], nodes, title="Cluster"))
    out.print(cluster_age(found["cluster"]), markup=False)


# A snapshot older than this was not refreshed by the reconcile (every 15 s by default): no worker reads Ray.
STALE_SNAPSHOT_S = 120.0


def cluster_age(cluster: dict[str, Any]) -> str:
    """How old the cluster's free/total figures are: the scheduler reads Ray, the CLI reads the scheduler."""
    age = cluster.get("age_s")
    if cluster.get("as_of") is None or age is None:
        return "The scheduler has not read the cluster yet (is a Celery worker running?)."
    line = f"Free after the scheduler's grants, as it read the cluster {age:.0f} s ago ({cluster['as_of']})."
    if age > STALE_SNAPSHOT_S:
        line += " Stale: no worker has read the cluster since; is a Celery worker with beat running?"
    return line
