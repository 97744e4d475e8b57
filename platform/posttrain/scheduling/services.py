"""Admission: the Celery worker's side of the scheduler (docs/ARCHITECTURE.md, "The scheduler").

`runs_admit` looks at the waiting native runs (queued, preempted) and the Ray cluster, and moves those
that fit now `queued → starting` in the order of posttrain.scheduling.rules, then submits their Ray
jobs; every other waiting run gets its queue position and the reason it waits. It runs when a run is
launched, when a run stops holding resources (it ends, fails, is cancelled or preempted) and on the
periodic reconcile.

Preemption: when the run at the head of the queue does not fit, running runs of a lower priority may
be moved `running → preempting` to make room (posttrain.scheduling.rules.preemption_victims). Their
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
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from posttrain.core import dispatch
from posttrain.core.errors import IllegalTransition, JobsUnavailable
from posttrain.runs.models import TERMINAL_STATES, Run, RunKind, RunTransition
from posttrain.runs.services.jobs_client import default_jobs
from posttrain.runs.services.rewind import run_rewind
from posttrain.runs.services.run_fields import clean_priority
from posttrain.runs.services.state_machine import ACTIVE_STATES, WAITING_STATES, S, run_transition
from posttrain.scheduling.backfill import Allocation
from posttrain.scheduling.durations import expected_length, expected_remaining, experiment_paces
from posttrain.scheduling.fair_share import Teams, fair_share
from posttrain.scheduling.models import ClusterSample, ClusterSnapshot, Preemption, Quota
from posttrain.scheduling.rules import (
    GROUP_TEAM,
    PROJECT_TEAM,
    RESOURCE_KEYS,
    Candidate,
    ClusterView,
    Decision,
    Holder,
    Limits,
    Plan,
    Resources,
    Usage,
    add,
    admission_plan,
    describe,
    over_quotas_alone,
    preemption_victims,
    project_account,
    subtract,
    team_key,
    team_kind_and_name,
    too_large_for_cluster,
    total_of,
)
from posttrain.scheduling.selectors import HIDDEN_RUN_NAME
from rl_engine.spec.checkpoints import checkpoint_step, latest_checkpoint

logger = logging.getLogger(__name__)

# Ray's resource report trails by a few seconds: a run that stopped holding within this window may
# still show in it, and is not taken for another job's use.
RAY_REPORT_LAG_S = 15.0


def _default_cluster() -> ClusterView:
    # The worker's reader of Ray's resource report, named in settings (the platform never imports workers).
    return import_module(settings.RUNS_CLUSTER_VIEW).cluster_view()


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


def _placement_of(run: Run, view: ClusterView) -> Allocation:
    """Where a holding run holds its resources: as admission placed it; on a one-node cluster, that node;
    otherwise unknown (empty), and Ray's report shows its use as another job's."""
    if run.placement:
        return {node: {key: float(r.get(key, 0.0)) for key in RESOURCE_KEYS} for node, r in run.placement.items()}
    if len(view.nodes) == 1:
        return {view.nodes[0].node_id: total_of(run)}
    return {}


def _sum_by_node(allocations: Iterable[Allocation]) -> dict[str, Resources]:
    summed: dict[str, Resources] = {}
    for allocation in allocations:
        for node, resources in allocation.items():
            summed[node] = add(summed.get(node, {}), resources)
    return summed


def _free_by_node(view: ClusterView, holding: list[Run], now) -> dict[str, Resources]:
    """Each node's total, less what the platform granted there, less what Ray reports in use there beyond
    those grants and beyond the runs that stopped holding within Ray's report lag (other jobs).

    Ray picks the node of a job's driver itself, so a run may hold its CPU on another node than admission
    predicted: its grant sits idle on one node while another shows use beyond its grants. Grants older than
    Ray's report lag that are idle are matched against such use elsewhere, which then counts as the
    platform's own, and the idle grant is free again (without this, one run held two nodes' room)."""
    granted = _sum_by_node(_placement_of(run, view) for run in holding)
    lag = timedelta(seconds=RAY_REPORT_LAG_S)
    settled = _sum_by_node(
        _placement_of(run, view) for run in holding if run.state_changed_at and now - run.state_changed_at >= lag
    )
    stopped_holding = RunTransition.objects.filter(
        run__kind=RunKind.NATIVE, from_state__in=ACTIVE_STATES, at__gte=now - lag
    ).exclude(to_state__in=ACTIVE_STATES)
    released = _sum_by_node(
        _placement_of(run, view)
        for run in Run.objects.filter(pk__in=stopped_holding.values("run_id")).exclude(state__in=ACTIVE_STATES)
    )
    foreign: dict[str, Resources] = {}
    idle: dict[str, Resources] = {}
    for node in view.nodes:
        mine, gone = granted.get(node.node_id, {}), released.get(node.node_id, {})
        ray_used = subtract(node.total, node.free)
        foreign[node.node_id] = {
            key: max(0.0, ray_used[key] - mine.get(key, 0.0) - gone.get(key, 0.0)) for key in RESOURCE_KEYS
        }
        old_grants = settled.get(node.node_id, {})
        idle[node.node_id] = {
            key: max(0.0, min(old_grants.get(key, 0.0), mine.get(key, 0.0) - ray_used[key])) for key in RESOURCE_KEYS
        }
    all_idle = {key: sum(r[key] for r in idle.values()) for key in RESOURCE_KEYS}
    all_foreign = {key: sum(r[key] for r in foreign.values()) for key in RESOURCE_KEYS}
    # Each idle grant is freed in proportion to its share of the idle grants, up to what was misplaced.
    freed_share = {
        key: min(all_foreign[key], all_idle[key]) / all_idle[key] if all_idle[key] else 0.0 for key in RESOURCE_KEYS
    }
    free: dict[str, Resources] = {}
    for node in view.nodes:
        given_back = {key: idle[node.node_id][key] * freed_share[key] for key in RESOURCE_KEYS}
        held_here = add(granted.get(node.node_id, {}), foreign[node.node_id])
        free[node.node_id] = add(subtract(node.total, held_here), given_back)
    return free


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
        run_start(run_id, jobs=jobs)
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


def _record_cluster(
    snapshot: ClusterSnapshot,
    view: ClusterView,
    free: dict[str, Resources],
    holding: list[Run],
    admitted: list[str],
    by_id: dict[str, Run],
    now,
) -> None:
    """The snapshot the queue page and `posttrain queue ls` read (each node's free room after this pass's
    grants, not Ray's lagging report), and a sample of the cluster's use over time."""
    nodes = view.as_dict()["nodes"]
    for node in nodes:
        node["free"] = {key: max(0.0, free.get(node["node_id"], node["free"]).get(key, 0.0)) for key in RESOURCE_KEYS}
    snapshot.nodes = nodes
    snapshot.total = view.total
    snapshot.free = {key: sum(n["free"][key] for n in nodes) for key in RESOURCE_KEYS}
    snapshot.taken_at = now
    snapshot.save()
    granted = {key: 0.0 for key in RESOURCE_KEYS}
    for run in [*holding, *(by_id[run_id] for run_id in admitted)]:
        granted = add(granted, total_of(run))
    ClusterSample.objects.create(at=now, total=view.total, granted=granted, used=subtract(view.total, view.free))
    ClusterSample.objects.filter(at__lt=now - timedelta(seconds=settings.SCHEDULER_SAMPLES_KEEP_S)).delete()


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


def _preempt_for(
    blocked: Candidate,
    name: str,
    free: dict[str, Resources],
    holding: list[Run],
    view: ClusterView,
    teams: Teams,
) -> list[str]:
    """Move the running runs that must make room for `blocked` to `preempting` (compare-and-set); their
    engines are asked after commit. Runs already preempting count as room on its way. A run of a team (a
    project or a group) within its lending quota also takes back room other teams borrowed (docs/SCHEDULER.md,
    "Lending quotas")."""
    coming_free = _sum_by_node(_placement_of(run, view) for run in holding if run.state == S.PREEMPTING)
    nominal, team_held = _teams(teams, holding)
    borrowed = _borrowed(holding, teams, nominal, team_held)
    team = blocked.team
    reclaims = team in nominal and not _over(add(team_held.get(team, {}), blocked.need), nominal[team])
    running = [
        Holder(
            str(r.pk),
            r.priority,
            r.created_at,
            total_of(r),
            r.preemptible,
            placement=_placement_of(r, view),
            borrowed=str(r.pk) in borrowed and _team_of(r, teams) != team,
        )
        for r in holding
        if r.state == S.RUNNING
    ]
    victims = preemption_victims(blocked, free, running, coming_free, reclaims=reclaims)
    lent = {h.run_id for h in running if h.borrowed}
    project_of = {str(r.pk): r.project.name for r in holding}
    made = []
    for run_id in victims:
        reclaimer = team if run_id in lent and reclaims else ""
        why = _preemption_reason(blocked, name, project_of[run_id], reclaimer)
        if run_transition(run_id, [S.RUNNING], S.PREEMPTING, why):
            Preemption.objects.create(run_id=run_id, reason=why)
            made.append(run_id)
    return made


def _preemption_reason(blocked: Candidate, name: str, victim_project: str, reclaimer: str) -> str:
    """Why a run is preempted for `blocked` (`reclaimer`: the team taking back what the run borrowed, if that is
    why), as the preempted run's readers see it: the run it makes room for is named only within the same project,
    as on the queue (docs/SECURITY.md, "The shared queue")."""
    who = (name or blocked.run_id) if victim_project == blocked.project else HIDDEN_RUN_NAME
    if not reclaimer:
        return f"preempted for {who} ({blocked.priority} priority, needs {describe(blocked.need)})"
    kind, team_name = team_kind_and_name(reclaimer)
    # A project takes back only what other projects' runs borrowed (its own runs are its team): unnamed.
    whose = "project" if kind == PROJECT_TEAM else f"team {team_name}"
    return f"preempted for {who}: its {whose} takes back the quota this run borrowed"


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


def _resume_point(run: Run) -> int:
    """The step the run resumes after: its latest checkpoint in its run folder, else the checkpoint it was
    launched from, else 0 (it starts over)."""
    run_dir = (run.resolved_config or {}).get("logging", {}).get("run_dir")
    own = checkpoint_step(latest_checkpoint(Path(run_dir))) if run_dir else None
    if own is not None:
        return own
    return run.resume_from.step if run.resume_from_id is not None and run.resume_from else 0


def run_preemption_settle(
    run_id: uuid.UUID | str, *, forced: bool, checkpoint: str | None = None, note: str | None = None
) -> bool:
    """preempting → preempted, with the preemption's record: the step the run reached and the checkpoint
    step it resumes after. A run stopped at the deadline (`forced`) loses the steps between them: they are
    counted, said in its history and rewound from its store (it records them again when it resumes)."""
    run = Run.objects.filter(pk=run_id, state=S.PREEMPTING).select_related("resume_from").first()
    if run is None:
        return False
    reached = run.last_step or 0
    resumes_after = checkpoint_step(checkpoint) if checkpoint else None
    if resumes_after is None:
        resumes_after = _resume_point(run) if forced else reached
    lost = max(0, reached - resumes_after)
    grace = f"{settings.SCHEDULER_PREEMPT_GRACE_S:g}"
    reason = (
        f"preempted: still running {grace} s after the request (scheduler.preempt_grace_s), so its job was "
        f"stopped; resumes after step {resumes_after}, {lost} step{'s' if lost != 1 else ''} lost"
        if forced
        else note or f"preempted: checkpointed after step {resumes_after}"
    )
    if not run_transition(run.pk, [S.PREEMPTING], S.PREEMPTED, reason):
        return False
    if lost:
        run_rewind(run.pk, resumes_after)
        Run.objects.filter(pk=run.pk).update(lost_steps=F("lost_steps") + lost)
    record_preemption_settled(run.pk, forced=forced, step=reached, resumed_step=resumes_after, lost=lost)
    return True


def record_preemption_settled(run_id, *, forced: bool, step: int | None, resumed_step: int | None, lost: int) -> None:
    """Close the run's open preemption record (or make one: the engine may stop for a request file alone)."""
    fields = {
        "settled_at": timezone.now(),
        "forced": forced,
        "step": step,
        "resumed_step": resumed_step,
        "lost_steps": lost,
    }
    open_one = Preemption.objects.filter(run_id=run_id, settled_at__isnull=True).order_by("-requested_at").first()
    if open_one is None:
        Preemption.objects.create(run_id=run_id, reason="the engine stopped for a preemption request", **fields)
    else:
        Preemption.objects.filter(pk=open_one.pk).update(**fields)


def run_preemption_deadline(run: Run, jobs, now) -> bool:
    """A preempting run whose job still runs past the deadline has its job stopped (Ray: SIGTERM, then
    SIGKILL); the reconcile settles it when the job has ended. True when this call stopped it."""
    waited = (now - run.state_changed_at).total_seconds()
    if run.state != S.PREEMPTING or waited < settings.SCHEDULER_PREEMPT_GRACE_S:
        return False
    if not Preemption.objects.filter(run=run, settled_at__isnull=True).update(forced=True):
        Preemption.objects.create(run=run, reason=run.state_reason, forced=True)
    jobs.stop(run)
    return True


def preemption_forced(run: Run) -> bool:
    """Whether the run's open preemption is past its deadline (its job was, or is being, stopped)."""
    return Preemption.objects.filter(run=run, settled_at__isnull=True, forced=True).exists()
