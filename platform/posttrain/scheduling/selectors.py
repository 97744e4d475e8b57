"""Reads of the scheduler's queue (docs/ARCHITECTURE.md, "The scheduler"): waiting runs in admission
order with their expected starts, running runs with their grants and nodes, and the cluster as the last
admission pass saw it, with its age. The web process never asks Ray: positions, reasons, expected starts
and the nodes are what the worker's admission stored (the reconcile reads the cluster every
POSTTRAIN_RUN_RECONCILE_INTERVAL_S, so the snapshot is at most about that old while a worker runs)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from posttrain.projects.access import AnyUser, readable_project_ids
from posttrain.runs.models import Run, RunKind
from posttrain.runs.services.state_machine import ACTIVE_STATES, WAITING_STATES
from posttrain.scheduling.models import ClusterSnapshot
from posttrain.scheduling.rules import total_of

HIDDEN_RUN_NAME = "a run of another project"


def _owner(run: Run) -> str | None:
    return run.created_by.username if run.created_by is not None else None


def _identity(run: Run, readable_projects: set[int] | None) -> dict[str, Any]:
    """Who a queued run is: in full for a run the user reads; for another project's run only that it is one
    (the cluster is shared, so its place, size and state stay visible: they explain the user's own waits), and
    its wait's reason only as "waiting" (reasons name runs)."""
    if readable_projects is None or run.project_id in readable_projects:
        return {
            "id": str(run.pk),
            "name": run.name,
            "owner": _owner(run),
            "project": run.project.name,
            "hidden": False,
            "reason": run.queue_reason or "not yet seen by the scheduler",
        }
    return {"id": None, "name": HIDDEN_RUN_NAME, "owner": None, "project": None, "hidden": True, "reason": "waiting"}


def queue_overview(user: AnyUser, now: datetime | None = None) -> dict[str, Any]:
    """The queue as `user` may see it: runs of projects they do not read stay in it, without their names."""
    now = now or timezone.now()
    readable_projects = readable_project_ids(user)
    native = Run.objects.filter(kind=RunKind.NATIVE).select_related("created_by", "experiment", "project")
    waiting = sorted(
        native.filter(state__in=WAITING_STATES),
        key=lambda r: (r.queue_position is None, r.queue_position or 0, r.created_at),
    )
    running = list(native.filter(state__in=ACTIVE_STATES).order_by("started_at", "created_at"))
    snapshot = ClusterSnapshot.objects.filter(pk=1).first()
    return {
        "waiting": [
            {
                **_identity(run, readable_projects),
                "state": run.state,
                "priority": run.priority,
                "resources": total_of(run),
                "queue_position": run.queue_position,
                "waiting_since": run.state_changed_at,
                "estimated_start": run.queue_estimated_start if run.queue_position else None,
            }
            for run in waiting
        ],
        "running": [
            {
                **{k: v for k, v in _identity(run, readable_projects).items() if k != "reason"},
                "state": run.state,
                "priority": run.priority,
                "preemptible": run.preemptible,
                "attempt": run.attempt,
                "lost_steps": run.lost_steps,
                "placement": run.placement,
                "grant": total_of(run),
                "last_step": run.last_step,
                "total_steps": run.planned_steps,
                "started_at": run.started_at,
            }
            for run in running
        ],
        "cluster": {
            "nodes": snapshot.nodes if snapshot else [],
            "total": snapshot.total if snapshot else {},
            "free": snapshot.free if snapshot else {},
            "as_of": snapshot.taken_at if snapshot else None,
            "age_s": round((now - snapshot.taken_at).total_seconds(), 1) if snapshot and snapshot.taken_at else None,
        },
    }
