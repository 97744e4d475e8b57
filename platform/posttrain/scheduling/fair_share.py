"""Reads behind fair share over time and the queue's metrics: when each native run held its resources
(from its state history), each user's and team's decayed usage, teams and weights (docs/SCHEDULER.md,
"Fair share over time").

A team is a project or a group with a Quota (Django admin → Scheduling → Quotas). A run counts against its
project when its project has a quota, else against its user's first group with a quota by name, else against
no team (its user is a team of one): projects are how labs split work now, groups remain for sites that use
them. Weights come from the user's and the team's quota (1 without one)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db.models import Q

from posttrain.runs.models import Run, RunKind, RunState, RunTransition
from posttrain.runs.services.state_machine import ACTIVE_STATES
from posttrain.scheduling.models import Quota
from posttrain.scheduling.rules import (
    GROUP_TEAM,
    PROJECT_TEAM,
    FairShare,
    Resources,
    decayed_usage,
    dominant_share,
    team_key,
    total_of,
)

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
    project: str = ""  # its project's name


@dataclass(frozen=True)
class Teams:
    """Which team (rules.team_key) a run counts against, and each team's weight."""

    of_project: dict[str, str]  # project name -> its team, for the projects with a quota
    of_user: dict[str, str]  # user id -> the team of their first group with a quota, by name
    weight: dict[str, float]

    def of(self, owner: str, project: str) -> str:
        """The team of a run of `owner` in `project`: its project's when the project has a quota, else its
        user's group's, else "" (none)."""
        return self.of_project.get(project) or self.of_user.get(owner, "")


def holdings(since: datetime) -> list[Holding]:
    """Every stretch of holding that ended after `since` or still goes on, from the runs' transitions."""
    runs = {
        str(run.pk): run
        for run in Run.objects.filter(kind=RunKind.NATIVE)
        .exclude(state=RunState.DRAFT)
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since))
        .select_related("project")
        .only("id", "created_by_id", "project__name", "priority", "resources", "resolved_config", "state")
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
    owner = str(run.created_by_id or "")
    return Holding(str(run.pk), owner, run.priority, start, end, total_of(run), project=run.project.name)


def stretch_usage(h: Holding, cluster_total: Mapping[str, float], now: datetime, half_life_s: float) -> float:
    """One stretch's decayed usage: share-seconds of the cluster, each second weighted 2^(-age / half-life)."""
    start_age = (now - h.start).total_seconds()
    end_age = max(0.0, (now - h.end).total_seconds()) if h.end else 0.0
    return decayed_usage(dominant_share(h.resources, cluster_total), start_age, end_age, half_life_s)


def usage_by(
    stretches: Iterable[Holding],
    key_of: Callable[[Holding], str],
    cluster_total: Mapping[str, float],
    now: datetime,
    half_life_s: float,
) -> dict[str, float]:
    """The decayed usage of the stretches, summed by `key_of` each stretch."""
    usage: dict[str, float] = {}
    for h in stretches:
        key = key_of(h)
        usage[key] = usage.get(key, 0.0) + stretch_usage(h, cluster_total, now, half_life_s)
    return usage


def usage_by_owner(
    stretches: Iterable[Holding], cluster_total: Mapping[str, float], now: datetime, half_life_s: float
) -> dict[str, float]:
    """Each user's decayed usage."""
    return usage_by(stretches, lambda h: h.owner, cluster_total, now, half_life_s)


def teams_and_weights(user_ids: Iterable[str]) -> tuple[Teams, dict[str, float]]:
    """The teams (every project with a quota; each user's first group with a quota, by name) and the users' weights."""
    known = [int(uid) for uid in set(user_ids) if uid]
    user_weight = {str(q.user_id): q.weight for q in Quota.objects.filter(user_id__in=known) if q.user_id is not None}
    of_project: dict[str, str] = {}
    of_user: dict[str, str] = {}
    weight: dict[str, float] = {}
    for quota in Quota.objects.filter(project__isnull=False).select_related("project"):
        if quota.project is not None:
            team = team_key(PROJECT_TEAM, quota.project.name)
            of_project[quota.project.name], weight[team] = team, quota.weight
    memberships = (
        get_user_model()
        .groups.through.objects.filter(user_id__in=known, group__run_quota__isnull=False)
        .select_related("group", "group__run_quota")
        .order_by("group__name")
    )
    for membership in memberships:
        team = team_key(GROUP_TEAM, membership.group.name)
        weight[team] = membership.group.run_quota.weight
        of_user.setdefault(str(membership.user_id), team)
    return Teams(of_project, of_user, weight), user_weight


def fair_share(
    owners: Iterable[str], cluster_total: Mapping[str, float], now: datetime, half_life_s: float
) -> tuple[FairShare, Teams]:
    """The FairShare the admission pass orders by, and the teams its runs count against. Past usage counts for
    the team each run would count against now (a quota set today makes its project's history count at once)."""
    stretches = holdings(now - timedelta(seconds=half_life_s * HORIZON_HALF_LIVES))
    teams, user_weight = teams_and_weights(set(owners) | {h.owner for h in stretches})
    by_user = usage_by_owner(stretches, cluster_total, now, half_life_s)
    by_team = usage_by(stretches, lambda h: teams.of(h.owner, h.project), cluster_total, now, half_life_s)
    by_team.pop("", None)  # the runs of no team
    return FairShare(by_user, by_team, user_weight, teams.weight), teams
