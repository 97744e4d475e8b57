"""Admission: the Celery worker's side of the scheduler (docs/ARCHITECTURE.md, "The scheduler").

`runs_admit` looks at the waiting native runs (queued, preempted) and the Ray cluster, and moves those
that fit now `queued → starting` in the order of posttrain.runs.scheduling, then submits their Ray
jobs; every other waiting run gets its queue position and the reason it waits. It runs when a run is
launched, when a run stops holding resources (it ends, fails, is cancelled or preempted) and on the
periodic reconcile.

Preemption: when the run at the head of the queue does not fit, running runs of a lower priority may
be moved `running → preempting` to make room (posttrain.runs.scheduling.preemption_victims). Their
engines are asked (a request file in the run folder, rl_engine/preemption.py) to checkpoint at the
next step boundary and exit; each then reports `preempted`, goes back to the queue, and when admitted
again resumes from that checkpoint as its next Ray job (`Run.attempt`, `Run.ray_job_id`).

Safe under any number of workers: a pass holds a row lock on the ClusterSnapshot row for its whole
transaction, so passes run one after another, each seeing the grants of the ones before; and the
move to `starting` is a compare-and-set, so a run cancelled meanwhile is never admitted.

What is free: the cluster's total minus what the platform's own holding runs were granted (their
stored resource needs), minus what Ray reports in use beyond those grants (other jobs on the
cluster). Ray's report lags a few seconds behind; counting grants from the database makes a run that
was just admitted count at once and one that just ended free at once (Ray starts the next job as
soon as the old one's process is gone: its own enforcement, the entrypoint resources and the
placement group, is the last word).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable
from contextlib import nullcontext, suppress
from datetime import timedelta
from importlib import import_module

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from posttrain.core.errors import IllegalTransition, JobsUnavailable, PermissionDenied
from posttrain.runs.models import TERMINAL_STATES, ClusterSnapshot, Quota, Run, RunKind, RunTransition
from posttrain.runs.scheduling import (
    RESOURCE_KEYS,
    Candidate,
    ClusterView,
    Holder,
    Limits,
    Resources,
    Usage,
    add,
    admission_plan,
    describe,
    over_quota_alone,
    preemption_victims,
    subtract,
    too_large_for_cluster,
    total_of,
)
from posttrain.runs.services import dispatch
from posttrain.runs.services.jobs_client import default_jobs
from posttrain.runs.services.run_fields import clean_priority, may_set_urgent
from posttrain.runs.services.state_machine import ACTIVE_STATES, WAITING_STATES, S, run_transition

logger = logging.getLogger(__name__)

# Ray's resource report trails by a few seconds: a run that stopped holding within this window may
# still show in it, and is not taken for another job's use.
RAY_REPORT_LAG_S = 15.0


def _default_cluster() -> ClusterView:
    # The worker's reader of Ray's resource report, named in settings (the platform never imports workers).
    return import_module(settings.RUNS_CLUSTER_VIEW).cluster_view()


def _owner(run: Run) -> str:
    return str(run.created_by_id or "")


def quota_limits(user_ids: Iterable[int | None]) -> dict[str, Limits]:
    """Each user's tightest limits: their own quota and every quota of their groups."""
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

    def tightest(values: list):
        present = [v for v in values if v is not None]
        return min(present) if present else None

    return {
        str(uid): Limits(
            max_runs=tightest([q.max_runs for q in qs]),
            max_cpus=tightest([q.max_cpus for q in qs]),
            max_gpus=tightest([q.max_gpus for q in qs]),
        )
        for uid, qs in quotas.items()
    }


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


def _free_now(view: ClusterView, holding: list[Run], now) -> Resources:
    granted = {key: 0.0 for key in RESOURCE_KEYS}
    for run in holding:
        granted = add(granted, total_of(run))
    released = {key: 0.0 for key in RESOURCE_KEYS}
    stopped_holding = RunTransition.objects.filter(
        run__kind=RunKind.NATIVE, from_state__in=ACTIVE_STATES, at__gte=now - timedelta(seconds=RAY_REPORT_LAG_S)
    ).exclude(to_state__in=ACTIVE_STATES)
    for run in Run.objects.filter(pk__in=stopped_holding.values("run_id")):
        released = add(released, total_of(run))
    ray_used = subtract(view.total, view.free)
    foreign = {key: max(0.0, ray_used[key] - granted[key] - released[key]) for key in RESOURCE_KEYS}
    return subtract(subtract(view.total, granted), foreign)


def runs_admit(
    *,
    cluster: Callable[[], ClusterView] | None = None,
    jobs=None,
    now=None,
) -> list[str]:
    """One admission pass: admit and submit the waiting runs that fit now, in order; tell the others
    why they wait. Returns the ids of the runs admitted."""
    if settings.SCHEDULER != "admission":
        return []
    if not Run.objects.filter(kind=RunKind.NATIVE, state__in=WAITING_STATES).exists():
        return []  # nothing to admit: Ray is not asked
    view = (cluster or _default_cluster)()  # an HTTP call: before the lock, never while holding it
    now = now or timezone.now()
    with _sqlite_guard(), transaction.atomic():
        snapshot = _locked_snapshot()
        holding = list(Run.objects.filter(kind=RunKind.NATIVE, state__in=ACTIVE_STATES))
        waiting = list(Run.objects.filter(kind=RunKind.NATIVE, state__in=WAITING_STATES).order_by("created_at"))
        usage: dict[str, Usage] = {}
        for run in holding:
            usage[_owner(run)] = usage.get(_owner(run), Usage()).plus(total_of(run))
        limits = quota_limits(r.created_by_id for r in waiting)
        held: dict[str, str] = {}  # run id -> why it can never start as it is
        candidates = []
        node_totals = [n.total for n in view.nodes]
        for run in waiting:
            needs = run.resources or {}
            never = over_quota_alone(total_of(run), limits.get(_owner(run), Limits())) or too_large_for_cluster(
                [needs.get("driver", {}), *needs.get("bundles", [])], node_totals
            )
            if never:
                held[str(run.pk)] = f"can never start as it is: {never}"
                continue
            candidates.append(
                Candidate(str(run.pk), _owner(run), run.priority, run.state_changed_at, run.created_at, total_of(run))
            )
        free_left = _free_now(view, holding, now)
        decisions = admission_plan(candidates, free_left, usage, limits, view.total, now, settings.SCHEDULER_AGING_S)
        by_id = {str(run.pk): run for run in waiting}
        candidate_of = {c.run_id: c for c in candidates}
        admitted: list[str] = []
        preempted: list[str] = []
        position = 0
        for decision in decisions:
            run = by_id[decision.run_id]
            if decision.admit:
                free_left = subtract(free_left, total_of(run))
                if _admit(run, decision.reason):
                    admitted.append(decision.run_id)
                continue
            position += 1
            reason = decision.reason
            if decision.blocking and settings.SCHEDULER_PREEMPTION:
                victims = _preempt_for(candidate_of[decision.run_id], run.name, free_left, holding)
                preempted += victims
                if victims or any(h.state == S.PREEMPTING for h in holding):
                    reason += "; preempting lower-priority runs to make room"
            Run.objects.filter(pk=decision.run_id).update(queue_position=position, queue_reason=reason)
        for run_id, reason in held.items():
            Run.objects.filter(pk=run_id).update(queue_position=None, queue_reason=reason)
        snapshot.nodes = view.as_dict()["nodes"]
        snapshot.total, snapshot.free, snapshot.taken_at = view.total, view.free, now
        snapshot.save()
    for run_id in preempted:
        run_request_preemption(run_id, jobs=jobs)
    for run_id in admitted:
        run_start(run_id, jobs=jobs)
    return admitted


def _admit(run: Run, grant: str) -> bool:
    """waiting → starting by compare-and-set; a preempted run's next Ray job is its next attempt."""
    resumes = run.state == S.PREEMPTED
    note = f"admitted: {grant}" + ("; resumes from its preemption checkpoint" if resumes else "")
    if not run_transition(run.pk, [run.state], S.STARTING, note):
        return False  # cancelled meanwhile
    fields: dict = {"queue_position": None, "queue_reason": ""}
    if resumes:
        fields["attempt"] = F("attempt") + 1
    Run.objects.filter(pk=run.pk).update(**fields)
    return True


def _preempt_for(blocked: Candidate, name: str, free: Resources, holding: list[Run]) -> list[str]:
    """Move the running runs that must make room for `blocked` to `preempting` (compare-and-set); their
    engines are asked after commit. Runs already preempting count as room on its way."""
    coming_free = {key: 0.0 for key in RESOURCE_KEYS}
    for run in holding:
        if run.state == S.PREEMPTING:
            coming_free = add(coming_free, total_of(run))
    running = [
        Holder(str(r.pk), r.priority, r.created_at, total_of(r), r.preemptible) for r in holding if r.state == S.RUNNING
    ]
    victims = preemption_victims(blocked, free, running, coming_free)
    reason = f"preempted for {name or blocked.run_id} ({blocked.priority} priority, needs {describe(blocked.need)})"
    return [run_id for run_id in victims if run_transition(run_id, [S.RUNNING], S.PREEMPTING, reason)]


def run_request_preemption(run_id: uuid.UUID | str, *, jobs=None) -> None:
    """Ask a preempting run's engine to checkpoint at its next step boundary and exit (it then reports
    `preempted`, or the reconcile reads its exit code 75)."""
    run = Run.objects.filter(pk=run_id, state=S.PREEMPTING).first()
    if run is None:
        return  # it ended or was cancelled meanwhile
    jobs = jobs or default_jobs()
    try:
        jobs.preempt(run, run.state_reason)
    except OSError as exc:  # the run folder is unreachable: the run keeps going and the reconcile asks again
        logger.warning("cannot ask run %s to stop for preemption: %s", run.pk, exc)


def run_start(run_id: uuid.UUID | str, *, jobs=None) -> None:
    """Submit an admitted (`starting`) run's Ray job; idempotent (submission id = run id). If Ray cannot
    take it yet the run goes back to the queue; a submit that fails otherwise fails the run."""
    run = Run.objects.filter(pk=run_id, state=S.STARTING).first()
    if run is None:
        return  # cancelled meanwhile: the cancel stops whatever exists
    jobs = jobs or default_jobs()
    try:
        jobs.submit(run)
    except JobsUnavailable as exc:
        logger.info("Ray cannot take admitted run %s yet (%s); it goes back to the queue", run.pk, exc)
        run_transition(run.pk, [S.STARTING], S.QUEUED, f"Ray could not take the job yet: {exc}")
    except Exception as exc:
        logger.warning("submitting run %s failed", run.pk, exc_info=True)
        run_transition(run.pk, [S.STARTING], S.FAILED, f"submitting the Ray job failed: {type(exc).__name__}: {exc}")


def run_set_priority(run: Run, priority, *, user) -> Run:
    """A new priority for a run that has not ended: its owner may move it within low..high, admins and
    staff anywhere (urgent included); the queue is ordered again at once."""
    if run.is_external:
        raise IllegalTransition("an external run is not scheduled; it has no priority", run.state)
    if run.created_by_id != getattr(user, "pk", None) and not may_set_urgent(user):
        raise PermissionDenied("only the run's owner or an admin may change its priority", loc="priority")
    priority = clean_priority(priority, user)
    with transaction.atomic():
        if not Run.objects.filter(pk=run.pk).exclude(state__in=TERMINAL_STATES).update(priority=priority):
            run.refresh_from_db()
            raise IllegalTransition(f"the run already ended ({run.state}); its priority no longer matters", run.state)
        transaction.on_commit(lambda: dispatch.run_task("admit_runs", run.pk))
    run.refresh_from_db()
    return run
