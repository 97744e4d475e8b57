"""The scheduler's metrics over a window of time (Kueue's set; docs/SCHEDULER.md, "Metrics"): queue wait
per priority, time from admission to first step, utilisation of the cluster's CPUs and GPUs over time
(granted by the platform and used as Ray reported), preemptions and their lost steps, and each user's,
team's and project's share of the cluster against its weight. The /queue/ page draws them (`GET
/api/queue/stats/`) and `GET /api/queue/metrics` gives them to Prometheus."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Min, Sum
from django.utils import timezone

from posttrain.projects.access import AnyUser, readable_project_ids
from posttrain.projects.models import Project
from posttrain.runs.models import Run, RunKind, RunTransition
from posttrain.runs.services.state_machine import WAITING_STATES, S
from posttrain.scheduling.fair_share import fair_share
from posttrain.scheduling.models import ClusterSample, ClusterSnapshot, Preemption
from posttrain.scheduling.rules import GROUP_TEAM, PROJECT_TEAM, RESOURCE_KEYS, team_kind_and_name
from posttrain.telemetry.models import MetricRow

DEFAULT_WINDOW_S = 86400.0
MIN_WINDOW_S, MAX_WINDOW_S = 60.0, 30 * 86400.0
MAX_POINTS = 120  # utilisation points drawn over the window


def quantiles(values: Iterable[float]) -> dict[str, float | int | None]:
    found = np.array(list(values), dtype=float)
    if not found.size:
        return {"count": 0, "p50_s": None, "p95_s": None}
    p50, p95 = np.percentile(found, [50, 95])
    return {"count": int(found.size), "p50_s": round(float(p50), 3), "p95_s": round(float(p95), 3)}


def admissions(since: datetime) -> list[tuple[str, str, datetime, float, int]]:
    """Every admission after `since`: (run id, priority, admitted at, seconds it waited, its attempt number)."""
    admitted = RunTransition.objects.filter(to_state=S.STARTING, from_state__in=WAITING_STATES, at__gte=since)
    priorities = dict(Run.objects.filter(pk__in=admitted.values("run_id")).values_list("pk", "priority"))
    moves = (
        RunTransition.objects.filter(run_id__in=list(priorities))
        .order_by("run_id", "at", "id")
        .values_list("run_id", "from_state", "to_state", "at")
    )
    found = []
    entered: dict[Any, datetime] = {}
    attempts: dict[Any, int] = {}
    for run_id, old, new, at in moves:
        if new in WAITING_STATES:
            entered[run_id] = at
        elif new == S.STARTING and old in WAITING_STATES and run_id in entered:
            number = attempts.get(run_id, 0)
            attempts[run_id] = number + 1
            if at >= since:
                found.append((str(run_id), priorities[run_id], at, (at - entered.pop(run_id)).total_seconds(), number))
    return found


def _first_steps(run_ids: list[str]) -> dict[str, float]:
    """Each run's first training step's time (the engine's clock, seconds since the epoch)."""
    rows = MetricRow.objects.filter(run_id__in=run_ids, step__gte=1).values("run_id").annotate(first=Min("time"))
    return {str(row["run_id"]): row["first"] for row in rows}


def utilisation(since: datetime, now: datetime) -> dict[str, Any]:
    """The cluster's granted and used fractions of each resource over time (per time bucket) and over the
    whole window. Each sample stands for the time until the next one, at most two reconcile intervals
    (passes also sample at launches and ends, so samples bunch; a longer gap is time no worker looked)."""
    samples = list(
        ClusterSample.objects.filter(at__gte=since, at__lte=now)
        .order_by("at")
        .values_list("at", "total", "granted", "used")
    )
    series: dict[str, list] = {"at": []}
    for key in RESOURCE_KEYS:
        series[f"granted_{key}"], series[f"used_{key}"] = [], []
    if not samples:
        return {"series": series, **{f"{kind}_{key}": None for kind in ("granted", "used") for key in RESOURCE_KEYS}}
    longest = 2 * settings.RUN_RECONCILE_INTERVAL_S
    times = [at for at, *_ in samples] + [now]
    rows = [
        (min((times[i + 1] - at).total_seconds(), longest), total, granted, used)
        for i, (at, total, granted, used) in enumerate(samples)
    ]
    width = max((now - since).total_seconds() / MAX_POINTS, 1e-9)
    buckets: dict[int, list] = {}
    for (at, *_), row in zip(samples, rows):
        buckets.setdefault(int((at - since).total_seconds() // width), []).append(row)
    for index in sorted(buckets):
        series["at"].append(since + timedelta(seconds=(index + 0.5) * width))
        for key in RESOURCE_KEYS:
            series[f"granted_{key}"].append(_fraction(buckets[index], 2, key))
            series[f"used_{key}"].append(_fraction(buckets[index], 3, key))
    overall = {
        f"{kind}_{key}": _fraction(rows, column, key)
        for kind, column in (("granted", 2), ("used", 3))
        for key in RESOURCE_KEYS
    }
    return {"series": series, **overall}


def _fraction(rows: list, column: int, key: str) -> float | None:
    """Of (seconds, total, granted, used) rows: the time-weighted share of the capacity in `column`."""
    capacity = sum(r[0] * float(r[1].get(key, 0.0)) for r in rows)
    held = sum(r[0] * float(r[column].get(key, 0.0)) for r in rows)
    return round(held / capacity, 4) if capacity else None


def _share_rows(
    usage: dict[str, float], weights: dict[str, float], label: Callable[[str], str | None]
) -> list[dict[str, Any]]:
    """Each one's share of the usage against its share of the weights, the largest user first; the shares are of
    everyone in `usage`, and those `label` names None are left out (their shares still count in the others')."""
    used_sum = sum(usage.values()) or 1.0
    weight_sum = sum(weights.get(name, 1.0) for name in usage) or 1.0
    found = []
    for key, used in usage.items():
        name = label(key)
        if name is not None:
            weight = weights.get(key, 1.0)
            found.append(
                {
                    "name": name,
                    "usage": round(used, 3),
                    "share": round(used / used_sum, 4),
                    "weight": weight,
                    "weight_share": round(weight / weight_sum, 4),
                }
            )
    return sorted(found, key=lambda row: -row["usage"])


def _of_kind(usage: dict[str, float], kind: str) -> dict[str, float]:
    return {key: used for key, used in usage.items() if team_kind_and_name(key)[0] == kind}


def shares(now: datetime, viewer: AnyUser | None = None) -> dict[str, list[dict[str, Any]]]:
    """Each user's, team's (group's) and project's share of the decayed usage against its share of the weights.
    A `viewer` sees only the projects they read by name (as on the queue, docs/SECURITY.md "The shared queue");
    the others' usage still counts in the shares of those shown. No viewer: every project (the metrics' own
    callers)."""
    snapshot = ClusterSnapshot.objects.filter(pk=1).first()
    total = snapshot.total if snapshot and snapshot.total else {"CPU": 1.0, "GPU": 0.0}
    fair, _ = fair_share([], total, now, settings.SCHEDULER_USAGE_HALF_LIFE_S)
    names = dict(
        get_user_model().objects.filter(pk__in=[int(u) for u in fair.user_usage if u]).values_list("pk", "username")
    )
    readable = None if viewer is None else readable_project_ids(viewer)
    shown = None if readable is None else set(Project.objects.filter(pk__in=readable).values_list("name", flat=True))

    def project_label(key: str) -> str | None:
        name = team_kind_and_name(key)[1]
        return name if shown is None or name in shown else None

    return {
        "users": _share_rows(
            fair.user_usage,
            fair.user_weight,
            lambda uid: names.get(int(uid), "(deleted user)") if uid else "(no owner)",
        ),
        "teams": _share_rows(
            _of_kind(fair.team_usage, GROUP_TEAM), fair.team_weight, lambda key: team_kind_and_name(key)[1]
        ),
        "projects": _share_rows(_of_kind(fair.team_usage, PROJECT_TEAM), fair.team_weight, project_label),
    }


def queue_metrics(
    window_s: float = DEFAULT_WINDOW_S, now: datetime | None = None, viewer: AnyUser | None = None
) -> dict[str, Any]:
    """The metrics over the last `window_s`, as `viewer` may see them (shares)."""
    now = now or timezone.now()
    since = now - timedelta(seconds=window_s)
    found = admissions(since)
    waits: dict[str, list[float]] = {}
    for _, priority, _, waited, _ in found:
        waits.setdefault(priority, []).append(waited)
    firsts = [(run_id, at) for run_id, _, at, _, attempt in found if attempt == 0]
    first_step = _first_steps([run_id for run_id, _ in firsts])
    preemptions = Preemption.objects.filter(requested_at__gte=since)
    lost = preemptions.aggregate(total=Sum("lost_steps"))["total"] or 0
    return {
        "window_s": window_s,
        "as_of": now,
        "queue_wait": {priority: quantiles(values) for priority, values in sorted(waits.items())},
        "admission_to_first_step": quantiles(
            first_step[run_id] - at.timestamp() for run_id, at in firsts if run_id in first_step
        ),
        "utilisation": utilisation(since, now),
        "preemptions": {
            "count": preemptions.count(),
            "forced": preemptions.filter(forced=True).count(),
            "lost_steps": int(lost),
        },
        "shares": shares(now, viewer),
        "waiting": Run.objects.filter(state__in=WAITING_STATES, kind=RunKind.NATIVE).count(),
        "totals": {
            "preemptions": Preemption.objects.count(),
            "forced_preemptions": Preemption.objects.filter(forced=True).count(),
            "lost_steps": int(Preemption.objects.aggregate(total=Sum("lost_steps"))["total"] or 0),
        },
    }
