"""How long runs are expected to take, for backfill and the queue's estimated starts (docs/SCHEDULER.md,
"Backfill"): from the run's own pace once it has steps, before that from the experiment's earlier runs,
else from its declared limit (`train.max_wall_s`, which the engine enforces); unknown otherwise."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from datetime import datetime

from posttrain.runs.models import Run, RunState
from posttrain.scheduling.models import Preemption

# A run that is leaving (cancelled, or asked to stop for a preemption) is gone within about this long, or
# within the preemption deadline, whichever is sooner.
LEAVING_S = 30.0
HISTORY_RUNS = 10  # the experiment's latest finished runs its pace is read from


def declared_limit(run: Run) -> float | None:
    config = run.resolved_config if isinstance(run.resolved_config, dict) else {}
    train = config.get("train") if isinstance(config.get("train"), dict) else {}
    limit = train.get("max_wall_s") if train else None
    return float(limit) if isinstance(limit, (int, float)) and limit > 0 else None


def seconds_per_step(runs: Iterable[Run]) -> float | None:
    """The median pace of finished runs that ran in one go (no preemption), in seconds per step."""
    paces = [
        (run.finished_at - run.started_at).total_seconds() / run.last_step
        for run in runs
        if run.started_at and run.finished_at and run.last_step and not run.attempt
    ]
    return statistics.median(paces) if paces else None


def experiment_paces(experiment_ids: Iterable[object]) -> dict[object, float]:
    """Each experiment's pace from its latest runs that succeeded in one go."""
    found: dict[object, list[Run]] = {}
    runs = (
        Run.objects.filter(
            experiment_id__in=set(experiment_ids),
            state=RunState.SUCCEEDED,
            attempt=0,
            started_at__isnull=False,
            last_step__gt=0,
        )
        .only("experiment_id", "started_at", "finished_at", "last_step", "attempt")
        .order_by("-finished_at")
    )
    for run in runs:
        if len(found.setdefault(run.experiment_id, [])) < HISTORY_RUNS:
            found[run.experiment_id].append(run)
    return {eid: pace for eid, runs_of in found.items() if (pace := seconds_per_step(runs_of)) is not None}


def expected_length(run: Run, experiment_pace: float | None) -> float | None:
    """A run's whole expected length before it has a pace of its own (what is left, for a preempted one)."""
    steps = run.planned_steps
    limit = declared_limit(run)
    estimate = None
    if experiment_pace is not None and steps:
        estimate = experiment_pace * max(1, steps - (run.last_step or 0))
    own = _own_pace(run, None)
    if own is not None and steps:  # a preempted run knows its pace from its earlier attempts
        estimate = own * max(1, steps - (run.last_step or 0))
    if limit is not None:
        estimate = min(estimate, limit) if estimate is not None else limit
    return estimate


def resumed_step(run: Run) -> int:
    """The step the run's latest attempt (the one since `started_at`) started after: where the preemption
    settled before it left off (0 for a first attempt)."""
    if not run.attempt or run.started_at is None:
        return 0
    before = Preemption.objects.filter(run=run, resumed_step__isnull=False, settled_at__lte=run.started_at)
    latest = before.order_by("-settled_at").first()
    return (latest.resumed_step or 0) if latest else 0


def _own_pace(run: Run, now: datetime | None) -> float | None:
    """Seconds per step of this run: over its current attempt while it runs, else over its last one."""
    if not (run.started_at and run.last_step):
        return None
    end = now if now is not None else run.state_changed_at
    done = run.last_step - resumed_step(run)
    if done <= 0 or end is None or end <= run.started_at:
        return None
    return (end - run.started_at).total_seconds() / done


def expected_remaining(run: Run, now: datetime, experiment_pace: float | None, grace_s: float) -> float | None:
    """Seconds until a holding run gives its resources back (None: unknown)."""
    if run.state == RunState.CANCELLING:
        return LEAVING_S
    if run.state == RunState.PREEMPTING:  # at its next step boundary, or at the deadline when it is stopped
        return max(0.0, grace_s - (now - run.state_changed_at).total_seconds())
    steps = run.planned_steps
    pace = _own_pace(run, now) if run.state == RunState.RUNNING else None
    if pace is not None and steps:
        remaining: float | None = max(0.0, (steps - (run.last_step or 0)) * pace)
    else:
        length = expected_length(run, experiment_pace)
        since = run.started_at if run.state == RunState.RUNNING and run.started_at else run.state_changed_at
        remaining = None if length is None else max(0.0, length - (now - since).total_seconds())
    limit = declared_limit(run)
    if limit is not None and run.started_at and run.state == RunState.RUNNING:
        # The engine stops the run at its limit (counted in training time, which wall time bounds).
        ran = (now - run.started_at).total_seconds()
        bound = max(0.0, limit - ran) if not run.attempt else limit
        remaining = min(remaining, bound) if remaining is not None else bound
    return remaining
