"""Reads of the scheduler's queue (docs/ARCHITECTURE.md, "The scheduler"): waiting runs in admission
order with their expected starts, running runs with their grants and nodes, and the cluster as the last
admission pass saw it, with its age. The web process never asks Ray: positions, reasons, expected starts
and the nodes are what the worker's admission stored (the reconcile reads the cluster every
POSTTRAIN_RUN_RECONCILE_INTERVAL_S, so the snapshot is at most about that old while a worker runs)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from posttrain.runs.models import Run, RunKind
from posttrain.runs.services.state_machine import ACTIVE_STATES, WAITING_STATES
from posttrain.scheduling.models import ClusterSnapshot
from posttrain.scheduling.rules import total_of


def _owner(run: Run) -> str | None:
    return run.created_by.username if run.created_by is not None else None


def queue_overview(now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    native = Run.objects.filter(kind=RunKind.NATIVE).select_related("created_by", "experiment")
    waiting = sorted(
        native.filter(state__in=WAITING_STATES),
        key=lambda r: (r.queue_position is None, r.queue_position or 0, r.created_at),
    )
    running = list(native.filter(state__in=ACTIVE_STATES).order_by("started_at", "created_at"))
    snapshot = ClusterSnapshot.objects.filter(pk=1).first()
    return {
        "waiting": [
            {
                "id": str(run.pk),
                "name": run.name,
                "state": run.state,
                "owner": _owner(run),
                "priority": run.priority,
                "resources": total_of(run),
                "queue_position": run.queue_position,
                "reason": run.queue_reason or "not yet seen by the scheduler",
                "waiting_since": run.state_changed_at,
                "estimated_start": run.queue_estimated_start if run.queue_position else None,
            }
            for run in waiting
        ],
        "running": [
            {
                "id": str(run.pk),
                "name": run.name,
                "state": run.state,
                "owner": _owner(run),
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
