"""One admission pass (`runs_admit`): the waiting runs planned, admitted and placed in order, the others told why
they wait; the admitted runs' Ray jobs submitted, and a run's priority changed (the queue ordered again)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from posttrain.core import dispatch
from posttrain.core.errors import IllegalTransition
from posttrain.runs.models import TERMINAL_STATES, Run, RunKind
from posttrain.runs.services.run_fields import clean_priority
from posttrain.runs.services.state_machine import ACTIVE_STATES, WAITING_STATES, S, run_transition
from posttrain.scheduling.backfill import Allocation
from posttrain.scheduling.durations import expected_length, expected_remaining, experiment_paces
from posttrain.scheduling.fair_share import Teams, fair_share
from posttrain.scheduling.rules import (
    RESOURCE_KEYS,
    Candidate,
    ClusterView,
    Decision,
    Plan,
    admission_plan,
    over_quotas_alone,
    subtract,
    too_large_for_cluster,
    total_of,
)
from posttrain.scheduling.services.cluster import (
    _default_cluster,
    _free_by_node,
    _locked_snapshot,
    _placement_of,
    _record_cluster,
    _sqlite_guard,
)
from posttrain.scheduling.services.jobs import run_submit
from posttrain.scheduling.services.preemption import _preempt_for, run_request_preemption
from posttrain.scheduling.services.quotas import _owner, _team_of, holding_usage, project_quota_limits, quota_limits

logger = logging.getLogger(__name__)


def runs_admit(
    *,
    cluster: Callable[[], ClusterView] | None = None,
    jobs=None,
    now=None,
    refresh: bool = False,
) -> list[str]:
    """One admission pass: admit and submit the waiting runs that can start now (in order, and behind it
    by backfill), place each on nodes, tell the others why they wait and when they are expected to start.
    `refresh` (the periodic reconcile) reads the cluster and records it even with nobody waiting.
    Returns the ids of the runs admitted."""
    if settings.SCHEDULER != "admission":
        return []
    if not refresh and not Run.objects.filter(kind=RunKind.NATIVE, state__in=WAITING_STATES).exists():
        return []  # nothing to admit: Ray is not asked
    view = (cluster or _default_cluster)()  # an HTTP call: before the lock, never while holding it
    now = now or timezone.now()
    with _sqlite_guard(), transaction.atomic():
        snapshot = _locked_snapshot()
        native = Run.objects.filter(kind=RunKind.NATIVE).select_related("project")
        holding = list(native.filter(state__in=ACTIVE_STATES))
        waiting = list(native.filter(state__in=WAITING_STATES).order_by("created_at"))
        usage = holding_usage(holding)
        limits = {
            **quota_limits(r.created_by_id for r in waiting),
            **project_quota_limits(r.project_id for r in waiting),
        }
        fair, teams = fair_share(
            [_owner(r) for r in waiting + holding], view.total, now, settings.SCHEDULER_USAGE_HALF_LIFE_S
        )
        paces = experiment_paces(r.experiment_id for r in waiting + holding)
        candidates, held = _candidates(waiting, limits, teams, paces, view)
        grace = settings.SCHEDULER_PREEMPT_GRACE_S
        free = _free_by_node(view, holding, now)
        plan = Plan(
            free,
            view.total,
            [
                (expected_remaining(run, now, paces.get(run.experiment_id), grace), _placement_of(run, view))
                for run in holding
            ],
        )
        decisions = admission_plan(
            candidates,
            plan,
            usage,
            limits,
            now,
            settings.SCHEDULER_AGING_S,
            fair=fair,
            backfill=settings.SCHEDULER_BACKFILL,
        )
        by_id = {str(run.pk): run for run in waiting}
        candidate_of = {c.run_id: c for c in candidates}
        admitted: list[str] = []
        preempted: list[str] = []
        head: Decision | None = None
        for decision in decisions:
            if decision.admit:
                placement = decision.placement or {}
                free = {node: subtract(r, placement.get(node, {})) for node, r in free.items()}
                if _admit(by_id[decision.run_id], decision.reason, placement):
                    admitted.append(decision.run_id)
            elif decision.blocking:
                head = decision
        if head is not None and settings.SCHEDULER_PREEMPTION:
            # After every admission of the pass: the room a backfilled run took is not the head's to count.
            preempted = _preempt_for(candidate_of[head.run_id], by_id[head.run_id].name, free, holding, view, teams)
        preempting = bool(preempted) or any(h.state == S.PREEMPTING for h in holding)
        _record_queue(decisions, head, preempting, held, now)
        _record_cluster(snapshot, view, free, holding, admitted, by_id, now)
    for run_id in preempted:
        run_request_preemption(run_id, jobs=jobs)
    for run_id in admitted:
        run_submit(run_id, jobs=jobs, admitted=True)
    return admitted


def _candidates(
    waiting: list[Run], limits: dict, teams: Teams, paces: dict, view: ClusterView
) -> tuple[list[Candidate], dict[str, str]]:
    """The waiting runs as the plan sees them, and those held out (run id -> why it can never start as it is)."""
    held: dict[str, str] = {}
    candidates = []
    node_totals = [n.total for n in view.nodes]
    for run in waiting:
        needs = run.resources or {}
        pieces = [needs.get("driver", {}), *needs.get("bundles", [])]
        candidate = Candidate(
            str(run.pk),
            _owner(run),
            run.priority,
            run.state_changed_at,
            run.created_at,
            total_of(run),
            pieces=tuple({k: float(p.get(k, 0.0)) for k in RESOURCE_KEYS} for p in pieces if p) if needs else (),
            duration_s=expected_length(run, paces.get(run.experiment_id)),
            team=_team_of(run, teams),
            project=run.project.name,
        )
        never = over_quotas_alone(candidate, limits) or too_large_for_cluster(pieces, node_totals)
        if never:
            held[str(run.pk)] = f"can never start as it is: {never}"
            continue
        candidates.append(candidate)
    return candidates, held


def _record_queue(
    decisions: list[Decision], head: Decision | None, preempting: bool, held: dict[str, str], now
) -> None:
    """Each waiting run's position, the reason it waits and when it is expected to start."""
    position = 0
    for decision in decisions:
        if decision.admit:
            continue
        position += 1
        reason = decision.reason
        if decision is head and preempting:
            reason += "; preempting lower-priority runs to make room"
        start = None if decision.expected_start_s is None else now + timedelta(seconds=decision.expected_start_s)
        Run.objects.filter(pk=decision.run_id).update(
            queue_position=position, queue_reason=reason, queue_estimated_start=start
        )
    for run_id, reason in held.items():
        Run.objects.filter(pk=run_id).update(queue_position=None, queue_reason=reason, queue_estimated_start=None)


def _admit(run: Run, grant: str, placement: Allocation) -> bool:
    """waiting → starting by compare-and-set; a preempted run's next Ray job is its next attempt."""
    resumes = run.state == S.PREEMPTED
    note = f"admitted: {grant}" + ("; resumes from its preemption checkpoint" if resumes else "")
    if not run_transition(run.pk, [run.state], S.STARTING, note):
        return False  # cancelled meanwhile
    fields: dict = {"queue_position": None, "queue_reason": "", "queue_estimated_start": None, "placement": placement}
    if resumes:
        fields["attempt"] = F("attempt") + 1
    Run.objects.filter(pk=run.pk).update(**fields)
    return True


def run_set_priority(run: Run, priority, *, user) -> Run:
    """A new priority for a run that has not ended, within low..high (urgent: admins and staff only); the queue is
    ordered again at once. Who may change the run at all is the caller's check (posttrain.projects.access)."""
    if run.is_external:
        raise IllegalTransition("an external run is not scheduled; it has no priority", run.state)
    priority = clean_priority(priority, user)
    with transaction.atomic():
        if not Run.objects.filter(pk=run.pk).exclude(state__in=TERMINAL_STATES).update(priority=priority):
            run.refresh_from_db()
            raise IllegalTransition(f"the run already ended ({run.state}); its priority no longer matters", run.state)
        transaction.on_commit(lambda: dispatch.run_task("admit_runs", run.pk))
    run.refresh_from_db()
    return run
