"""Quotas: each user's and project's limits, what the holding runs use, and the lending teams' quotas with the
runs that borrow beyond them (docs/SCHEDULER.md, "Lending quotas")."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth import get_user_model

from posttrain.runs.models import Run
from posttrain.scheduling.fair_share import Teams
from posttrain.scheduling.models import Quota
from posttrain.scheduling.rules import (
    GROUP_TEAM,
    PROJECT_TEAM,
    RESOURCE_KEYS,
    Limits,
    Resources,
    Usage,
    add,
    project_account,
    subtract,
    team_key,
    total_of,
)


def _owner(run: Run) -> str:
    return str(run.created_by_id or "")


def _tightest(quotas: list[Quota]) -> Limits:
    """The tightest of each limit of `quotas`; a lending quota's CPU and GPU limits are a guarantee, not a cap."""

    def tightest(values: list):
        present = [v for v in values if v is not None]
        return min(present) if present else None

    caps = [q for q in quotas if not q.borrowing]
    return Limits(
        max_runs=tightest([q.max_runs for q in quotas]),
        max_cpus=tightest([q.max_cpus for q in caps]),
        max_gpus=tightest([q.max_gpus for q in caps]),
    )


def quota_limits(user_ids: Iterable[int | None]) -> dict[str, Limits]:
    """Each user's tightest limits: their own quota and every quota of their groups (each counts the user's
    own runs)."""
    known = [uid for uid in set(user_ids) if uid]
    quotas: dict[int, list[Quota]] = {uid: [] for uid in known}
    for quota in Quota.objects.filter(user_id__in=known):
        if quota.user_id is not None:
            quotas[quota.user_id].append(quota)
    memberships = get_user_model().groups.through.objects.filter(user_id__in=known)
    group_quotas = {q.group_id: q for q in Quota.objects.filter(group_id__in=memberships.values("group_id"))}
    for membership in memberships:
        if membership.group_id in group_quotas:
            quotas[membership.user_id].append(group_quotas[membership.group_id])
    return {str(uid): _tightest(qs) for uid, qs in quotas.items()}


def project_quota_limits(project_ids: Iterable[int | None]) -> dict[str, Limits]:
    """Each project's limits (rules.project_account keys), which count all the project's runs together."""
    found = Quota.objects.filter(project_id__in=set(project_ids)).select_related("project")
    return {project_account(q.project.name): _tightest([q]) for q in found if q.project is not None}


def holding_usage(holding: Iterable[Run]) -> dict[str, Usage]:
    """What the holding runs hold now, by user id and by project (rules.project_account)."""
    usage: dict[str, Usage] = {}
    for run in holding:
        for account in (_owner(run), project_account(run.project.name)):
            usage[account] = usage.get(account, Usage()).plus(total_of(run))
    return usage


TeamQuota = dict[str, float | None]  # "CPU", "GPU": the lending quota's limits (None: no limit)


def _team_of(run: Run, teams: Teams) -> str:
    return teams.of(_owner(run), run.project.name)


def _lending_quotas() -> dict[str, TeamQuota]:
    """Each lending team's (rules.team_key) CPU and GPU limits."""
    nominal: dict[str, TeamQuota] = {}
    for q in Quota.objects.filter(borrowing=True, user__isnull=True).select_related("group", "project"):
        if q.project is not None:
            nominal[team_key(PROJECT_TEAM, q.project.name)] = {"CPU": q.max_cpus, "GPU": q.max_gpus}
        elif q.group is not None:
            nominal[team_key(GROUP_TEAM, q.group.name)] = {"CPU": q.max_cpus, "GPU": q.max_gpus}
    return nominal


def _teams(teams: Teams, holding: list[Run]) -> tuple[dict[str, TeamQuota], dict[str, Resources]]:
    """Each lending team's quota (its CPU and GPU limits) and what its runs hold now."""
    nominal = _lending_quotas()
    held: dict[str, Resources] = {}
    for run in holding:
        team = _team_of(run, teams)
        if team in nominal:
            held[team] = add(held.get(team, {}), total_of(run))
    return nominal, held


def _over(held: Resources, quota: TeamQuota) -> bool:
    return any((limit := quota.get(k)) is not None and held.get(k, 0.0) > limit + 1e-9 for k in RESOURCE_KEYS)


def _borrowed(holding: list[Run], teams: Teams, nominal: dict, held: dict) -> set[str]:
    """The runs that hold room beyond their team's quota: the team's youngest, until the rest is within it."""
    borrowed: set[str] = set()
    for team, quota in nominal.items():
        left = dict(held.get(team, {}))
        mine = sorted((r for r in holding if _team_of(r, teams) == team), key=lambda r: r.created_at, reverse=True)
        for run in mine:
            if not _over(left, quota):
                break
            borrowed.add(str(run.pk))
            left = subtract(left, total_of(run))
    return borrowed
