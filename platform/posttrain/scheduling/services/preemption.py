"""Preemption: running runs moved to `preempting` to make room for the blocked head of the queue, their engines
asked to checkpoint and exit, and each preemption settled (the steps a forced stop lost) or forced at its deadline."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from posttrain.runs.models import Run
from posttrain.runs.services.state_machine import S, run_transition
from posttrain.scheduling.fair_share import Teams
from posttrain.scheduling.models import Preemption
from posttrain.scheduling.rules import (
    PROJECT_TEAM,
    Candidate,
    ClusterView,
    Holder,
    Resources,
    add,
    describe,
    preemption_victims,
    team_kind_and_name,
    total_of,
)
from posttrain.scheduling.selectors import HIDDEN_RUN_NAME
from posttrain.scheduling.services.cluster import _placement_of, _sum_by_node
from posttrain.scheduling.services.jobs_api import default_jobs
from posttrain.scheduling.services.quotas import _borrowed, _over, _team_of, _teams
from posttrain.telemetry.rewind import run_rewind
from rl_engine.spec.checkpoints import checkpoint_step, latest_checkpoint

logger = logging.getLogger(__name__)


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
