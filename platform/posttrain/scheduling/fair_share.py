"""Reads behind fair share over time and the queue's metrics: when each native run held its resources
(from its state history), each user's and team's decayed usage, teams and weights (docs/SCHEDULER.md,
"Fair share over time").

A team is a group with a Quota (Django admin → Runs → Quotas); a user in several such groups counts
against the first by name. Weights come from the user's and the team's quota (1 without one)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db.models import Q

from posttrain.runs.models import Run, RunKind, RunState, RunTransition
from posttrain.runs.services.state_machine import ACTIVE_STATES
from posttrain.scheduling.models import Quota
from posttrain.scheduling.rules import FairShare, Resources, decayed_usage, dominant_share, total_of

# Usage older than this many half-lives weighs under 0.4 % and is not read.
HORIZON_HALF_LIVES = 8


@dataclass(frozen=True)
class Holding:
    """One stretch of a run holding its resources: from its admission (→ starting) until it stopped
    holding (end None: it still holds them)."""

    run_id: str
    owner: str
    priority: str
    start: datetime
    end: datetime | None
    resources: Resources


def holdings(since: datetime) -> list[Holding]:
    """Every stretch of holding that ended after `since` or still goes on, from the runs' transitions."""
    runs = {
        str(run.pk): run
        for run in Run.objects.filter(kind=RunKind.NATIVE)
        .exclude(state=RunState.DRAFT)
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since))
        .only("id", "created_by_id", "priority", "resources", "resolved_config", "state")
    }
    moves = (
        RunTransition.objects.filter(run_id__in=list(runs))
        .order_by("run_id", "at", "id")
        .values_list("run_id", "from_state", "to_state", "at")
    )
    found: list[Holding] = []
    opened: dict[str, datetime] = {}
    for run_id, old, new, at in moves:
        key = str(run_id)
        if new in ACTIVE_STATES and old not in ACTIVE_STATES:
            opened[key] = at
        elif old in ACTIVE_STATES and new not in ACTIVE_STATES and key in opened:
            start = opened.pop(key)
            if at >= since:
                found.append(_holding(runs[key], start, at))
    for key, start in opened.items():
        found.append(_holding(runs[key], start, None))
    return found


def _holding(run: Run, start: datetime, end: datetime | None) -> Holding:
    return Holding(str(run.pk), str(run.created_by_id or ""), run.priority, start, end, total_of(run))


def usage_by_owner(
    stretches: Iterable[Holding], cluster_total: Mapping[str, float], now: datetime, half_life_s: float
) -> dict[str, float]:
    """Each user's decayed usage: share-seconds of the cluster, each second weighted 2^(-age / half-life)."""
    usage: dict[str, float] = {}
    for h in stretches:
        share = dominant_share(h.resources, cluster_total)
        start_age = (now - h.start).total_seconds()
        end_age = max(0.0, (now - h.end).total_seconds()) if h.end else 0.0
        usage[h.owner] = usage.get(h.owner, 0.0) + decayed_usage(share, start_age, end_age, half_life_s)
    return usage


def teams_and_weights(user_ids: Iterable[str]) -> tuple[dict[str, str], dict[str, float], dict[str, float]]:
    """Each user's team (the first of their groups with a quota, by name), and the users' and teams' weights."""
    known = [int(uid) for uid in set(user_ids) if uid]
    user_weight = {str(q.user_id): q.weight for q in Quota.objects.filter(user_id__in=known) if q.user_id is not None}
    team_of: dict[str, str] = {}
    team_weight: dict[str, float] = {}
    memberships = (
        get_user_model()
        .groups.through.objects.filter(user_id__in=known, group__run_quota__isnull=False)
        .select_related("group", "group__run_quota")
        .order_by("group__name")
    )
    for membership in memberships:
        team = membership.group.name
        team_weight[team] = membership.group.run_quota.weight
        team_of.setdefault(str(membership.user_id), team)
    return team_of, user_weight, team_weight


def fair_share(
    owners: Iterable[str], cluster_total: Mapping[str, float], now: datetime, half_life_s: float
) -> tuple[FairShare, dict[str, str]]:
    """The FairShare the admission pass orders by, and each user's team."""
    stretches = holdings(now - timedelta(seconds=half_life_s * HORIZON_HALF_LIVES))
    owners = set(owners) | {h.owner for h in stretches}
    team_of, user_weight, team_weight = teams_and_weights(owners)
    by_user = usage_by_owner(stretches, cluster_total, now, half_life_s)
    by_team: dict[str, float] = {}
    for owner, used in by_user.items():
        if owner in team_of:
            by_team[team_of[owner]] = by_team.get(team_of[owner], 0.0) + used
    return FairShare(by_user, by_team, user_weight, team_weight), team_of
