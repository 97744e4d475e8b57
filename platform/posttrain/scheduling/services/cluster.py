"""The cluster as admission sees it: Ray's report read, the pass's lock, each node's free room (less the
platform's own grants and other jobs' use), and the snapshot and samples recorded after each pass."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from contextlib import nullcontext, suppress
from datetime import timedelta
from importlib import import_module

from django.conf import settings
from django.db import IntegrityError, connection

from posttrain.runs.models import Run, RunKind, RunTransition
from posttrain.runs.services.state_machine import ACTIVE_STATES
from posttrain.scheduling.backfill import Allocation
from posttrain.scheduling.models import ClusterSample, ClusterSnapshot
from posttrain.scheduling.rules import (
    RESOURCE_KEYS,
    ClusterView,
    Resources,
    add,
    subtract,
    total_of,
)

# Ray's resource report trails by a few seconds: a run that stopped holding within this window may
# still show in it, and is not taken for another job's use.
RAY_REPORT_LAG_S = 15.0


def _default_cluster() -> ClusterView:
    # The worker's reader of Ray's resource report, named in settings (the platform never imports workers).
    return import_module(settings.RUNS_CLUSTER_VIEW).cluster_view()


def _locked_snapshot() -> ClusterSnapshot:
    """The one ClusterSnapshot row, locked until the transaction ends: it serializes admission passes."""
    with suppress(IntegrityError):  # another worker created it first
        ClusterSnapshot.objects.get_or_create(pk=1)
    return ClusterSnapshot.objects.select_for_update().get(pk=1)


# SQLite (the embedded default) ignores SELECT ... FOR UPDATE: the demo's one worker process (a thread
# pool) serializes its passes with this lock instead. Several worker processes need Postgres.
_SQLITE_PASS = threading.Lock()


def _sqlite_guard():
    return _SQLITE_PASS if connection.vendor == "sqlite" else nullcontext()


def _placement_of(run: Run, view: ClusterView) -> Allocation:
    """Where a holding run holds its resources: as admission placed it; on a one-node cluster, that node;
    otherwise unknown (empty), and Ray's report shows its use as another job's."""
    if run.placement:
        return {node: {key: float(r.get(key, 0.0)) for key in RESOURCE_KEYS} for node, r in run.placement.items()}
    if len(view.nodes) == 1:
        return {view.nodes[0].node_id: total_of(run)}
    return {}


def _sum_by_node(allocations: Iterable[Allocation]) -> dict[str, Resources]:
    summed: dict[str, Resources] = {}
    for allocation in allocations:
        for node, resources in allocation.items():
            summed[node] = add(summed.get(node, {}), resources)
    return summed


def _free_by_node(view: ClusterView, holding: list[Run], now) -> dict[str, Resources]:
    """Each node's total, less what the platform granted there, less what Ray reports in use there beyond
    those grants and beyond the runs that stopped holding within Ray's report lag (other jobs).

    Ray picks the node of a job's driver itself, so a run may hold its CPU on another node than admission
    predicted: its grant sits idle on one node while another shows use beyond its grants. Grants older than
    Ray's report lag that are idle are matched against such use elsewhere, which then counts as the
    platform's own, and the idle grant is free again (without this, one run held two nodes' room)."""
    granted = _sum_by_node(_placement_of(run, view) for run in holding)
    lag = timedelta(seconds=RAY_REPORT_LAG_S)
    settled = _sum_by_node(
        _placement_of(run, view) for run in holding if run.state_changed_at and now - run.state_changed_at >= lag
    )
    stopped_holding = RunTransition.objects.filter(
        run__kind=RunKind.NATIVE, from_state__in=ACTIVE_STATES, at__gte=now - lag
    ).exclude(to_state__in=ACTIVE_STATES)
    released = _sum_by_node(
        _placement_of(run, view)
        for run in Run.objects.filter(pk__in=stopped_holding.values("run_id")).exclude(state__in=ACTIVE_STATES)
    )
    foreign: dict[str, Resources] = {}
    idle: dict[str, Resources] = {}
    for node in view.nodes:
        mine, gone = granted.get(node.node_id, {}), released.get(node.node_id, {})
        ray_used = subtract(node.total, node.free)
        foreign[node.node_id] = {
            key: max(0.0, ray_used[key] - mine.get(key, 0.0) - gone.get(key, 0.0)) for key in RESOURCE_KEYS
        }
        old_grants = settled.get(node.node_id, {})
        idle[node.node_id] = {
            key: max(0.0, min(old_grants.get(key, 0.0), mine.get(key, 0.0) - ray_used[key])) for key in RESOURCE_KEYS
        }
    all_idle = {key: sum(r[key] for r in idle.values()) for key in RESOURCE_KEYS}
    all_foreign = {key: sum(r[key] for r in foreign.values()) for key in RESOURCE_KEYS}
    # Each idle grant is freed in proportion to its share of the idle grants, up to what was misplaced.
    freed_share = {
        key: min(all_foreign[key], all_idle[key]) / all_idle[key] if all_idle[key] else 0.0 for key in RESOURCE_KEYS
    }
    free: dict[str, Resources] = {}
    for node in view.nodes:
        given_back = {key: idle[node.node_id][key] * freed_share[key] for key in RESOURCE_KEYS}
        held_here = add(granted.get(node.node_id, {}), foreign[node.node_id])
        free[node.node_id] = add(subtract(node.total, held_here), given_back)
    return free


def _record_cluster(
    snapshot: ClusterSnapshot,
    view: ClusterView,
    free: dict[str, Resources],
    holding: list[Run],
    admitted: list[str],
    by_id: dict[str, Run],
    now,
) -> None:
    """The snapshot the queue page and `posttrain queue ls` read (each node's free room after this pass's
    grants, not Ray's lagging report), and a sample of the cluster's use over time."""
    nodes = view.as_dict()["nodes"]
    for node in nodes:
        node["free"] = {key: max(0.0, free.get(node["node_id"], node["free"]).get(key, 0.0)) for key in RESOURCE_KEYS}
    snapshot.nodes = nodes
    snapshot.total = view.total
    snapshot.free = {key: sum(n["free"][key] for n in nodes) for key in RESOURCE_KEYS}
    snapshot.taken_at = now
    snapshot.save()
    granted = {key: 0.0 for key in RESOURCE_KEYS}
    for run in [*holding, *(by_id[run_id] for run_id in admitted)]:
        granted = add(granted, total_of(run))
    ClusterSample.objects.create(at=now, total=view.total, granted=granted, used=subtract(view.total, view.free))
    ClusterSample.objects.filter(at__lt=now - timedelta(seconds=settings.SCHEDULER_SAMPLES_KEEP_S)).delete()
