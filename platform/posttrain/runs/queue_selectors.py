"""Reads of the scheduler's queue (docs/ARCHITECTURE.md, "The scheduler"): waiting runs in admission
order, running runs with their grants, and the cluster as the last admission pass saw it. The web
process never asks Ray: positions, reasons and the nodes are what the worker's admission stored."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from posttrain.runs.models import ClusterSnapshot, Run, RunKind
from posttrain.runs.scheduling import total_of
from posttrain.runs.services.state_machine import ACTIVE_STATES, WAITING_STATES


def remaining_seconds(run: Run, now: datetime) -> float | None:
    """How long a running run still needs, from its pace so far (steps done over time running)."""
    steps = run.planned_steps
    if not (run.started_at and run.last_step and steps):
        return None
    elapsed = (now - run.started_at).total_seconds()
    return max(0.0, (steps - run.last_step) * elapsed / run.last_step)


def estimated_starts(positions: int, running: list[Run], now: datetime) -> list[datetime | None]:
    """When each of the first `positions` waiting runs may start: the k-th as the k-th running run ends
    (runs of one size replacing each other); unknown past the running runs, or while one has no pace yet."""
    paces = [remaining_seconds(run, now) for run in running]
    known = [pace for pace in paces if pace is not None]
    if len(known) < len(paces):
        return [None] * positions
    remaining = sorted(known)
    return [now + timedelta(seconds=remaining[k]) if k < len(remaining) else None for k in range(positions)]


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
    starts = estimated_starts(len(waiting), running, now)
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
                "estimated_start": start if run.queue_position else None,
            }
            for run, start in zip(waiting, starts)
        ],
        "running": [
            {
                "id": str(run.pk),
                "name": run.name,
                "state": run.state,
                "owner": _owner(run),
                "priority": run.priority,
                "preemptible": run.preemptible,
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
        },
    }
