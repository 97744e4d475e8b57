"""Launch, clone, resume, edit and cancel runs (the web side). A new run is committed `queued`; the
Celery task that submits its Ray job is dispatched after commit, so a rolled-back write dispatches
nothing."""

from __future__ import annotations

import copy
import uuid
from typing import Any

from django.conf import settings
from django.db import transaction

from posttrain.core import dispatch
from posttrain.core.errors import IllegalTransition, InvalidInput
from posttrain.core.run_tokens import ingest_token, token_hash
from posttrain.core.server_paths import resolve_run_checkpoint
from posttrain.projects.models import Project
from posttrain.runs.locations import rollout_folder, run_dir_for
from posttrain.runs.models import (
    TERMINAL_STATES,
    Checkpoint,
    Experiment,
    Run,
    RunTransition,
)
from posttrain.runs.services.experiments import (
    experiment_copy,
    experiment_engine_config,
    validated_engine_config_and_needs,
)
from posttrain.runs.services.external import external_run_cancel, refuse_external
from posttrain.runs.services.run_fields import (
    clean_note,
    clean_preemptible,
    clean_priority,
    clean_seed,
    clean_tags,
)
from posttrain.runs.services.state_machine import S, run_transition


def _create_queued_run(
    *,
    experiment: Experiment,
    config: dict[str, Any],
    seed: int,
    tags: list[str],
    note: str,
    user,
    reason: str,
    parent: Run | None = None,
    resume_from: Checkpoint | None = None,
    priority: str = "normal",
    preemptible: bool = True,
) -> Run:
    run_id = uuid.uuid4()
    full = copy.deepcopy(config)
    full["seed"] = seed
    full["logging"] = {
        **(full.get("logging") or {}),
        "run_dir": str(run_dir_for(run_id)),
        "rollouts_dir": rollout_folder(run_id),
    }
    resolved, resources = validated_engine_config_and_needs(full)
    with transaction.atomic():
        number = Run.objects.filter(experiment=experiment).count() + 1
        run = Run.objects.create(
            id=run_id,
            experiment=experiment,
            project_id=experiment.project_id,
            name=f"{experiment.name} #{number}"[:200],
            seed=seed,
            state=S.QUEUED,
            state_reason=reason,
            resolved_config=resolved,
            tags=tags,
            note=note,
            parent=parent,
            resume_from=resume_from,
            ingest_token_hash=token_hash(ingest_token(run_id)),
            created_by=user if getattr(user, "is_authenticated", False) else None,
            resources=resources,
            priority=priority,
            preemptible=preemptible,
        )
        RunTransition.objects.create(run=run, from_state=S.DRAFT, to_state=S.QUEUED, reason=reason)
        # Admission submits it when the cluster holds it (posttrain.scheduling.services).
        task = "run_submit" if settings.SCHEDULER == "all-at-once" else "admit_runs"
        transaction.on_commit(lambda: dispatch.run_task(task, run_id))
    return run


def run_launch(
    experiment: Experiment,
    *,
    seed: int | None = None,
    tags: Any = None,
    note: Any = None,
    priority: Any = None,
    preemptible: Any = None,
    user=None,
) -> Run:
    """A new run of the experiment, committed as `queued`; a Celery task submits its Ray job after commit."""
    seed = clean_seed(
        seed, default=clean_seed(experiment.config.get("seed"), 0) if isinstance(experiment.config, dict) else 0
    )
    return _create_queued_run(
        experiment=experiment,
        config=experiment_engine_config(experiment),
        seed=seed,
        tags=clean_tags(tags),
        note=clean_note(note),
        user=user,
        reason=f"launched by {user_label(user)}",
        priority=clean_priority(priority, user),
        preemptible=clean_preemptible(preemptible, user),
    )


def run_clone(
    run: Run,
    *,
    project: Project | None = None,
    seed: int | None = None,
    tags: Any = None,
    note: Any = None,
    priority: Any = None,
    preemptible: Any = None,
    user=None,
) -> Run:
    """A new run with exactly the source run's config (not the experiment's current one); new seed optional.
    Into another `project` (the caller checked the user creates there), the run's experiment is copied there
    first, with its model, dataset and rewards (experiment_copy)."""
    refuse_external(run, "cloned")
    if not run.resolved_config:
        raise IllegalTransition("this run has no resolved config to clone (it was never launched)", run.state)
    experiment = run.experiment
    if project is not None and project.pk != run.project_id:
        experiment = experiment_copy(experiment, project, user=user)
    return _create_queued_run(
        experiment=experiment,
        config=run.resolved_config,
        seed=clean_seed(seed, run.seed),
        tags=clean_tags(run.tags if tags is None else tags),
        note=clean_note(note),
        user=user,
        reason=f"cloned from run {run.id} by {user_label(user)}",
        parent=run,
        priority=clean_priority(priority, user),
        preemptible=clean_preemptible(preemptible, user),
    )


def run_resume(run: Run, checkpoint: Checkpoint, *, user=None) -> Run:
    """A new run that continues `run` from one of its checkpoints (engine: `--resume <checkpoint>`)."""
    refuse_external(run, "resumed")
    if checkpoint.run_id != run.id:
        raise InvalidInput.one("checkpoint", f"checkpoint {checkpoint.pk} belongs to another run")
    if run.state not in TERMINAL_STATES:
        raise IllegalTransition(f"only a finished run can be resumed; this one is {run.state}", run.state)
    # The engine's checkpoint event names the folder: it must be this run's own (the resolver refuses another
    # run's folder, or anything else on the server a forged event could name).
    path = resolve_run_checkpoint("checkpoint", checkpoint.path, run.pk)
    if not path.is_dir():
        raise InvalidInput.one("checkpoint", f"the folder {path} no longer exists (pruned by checkpoint.keep_last?)")
    config = run.resolved_config
    assert config is not None  # a native run's config is stored when launch creates the run (_create_queued_run)
    return _create_queued_run(
        experiment=run.experiment,
        config=config,
        seed=run.seed,
        tags=list(run.tags),
        note="",
        user=user,
        reason=f"resumed from run {run.id} step {checkpoint.step} by {user_label(user)}",
        parent=run,
        resume_from=checkpoint,
        priority=clean_priority(run.priority if run.priority != "urgent" else None, user),
        preemptible=run.preemptible or clean_preemptible(False, user),
    )


_UNSET = object()


def run_update(run: Run, *, tags: Any = _UNSET, note: Any = _UNSET) -> Run:
    """Tags and note are the only fields edited after launch."""
    fields: dict[str, Any] = {}
    if tags is not _UNSET:
        fields["tags"] = clean_tags(tags)
    if note is not _UNSET:
        fields["note"] = clean_note(note)
    if fields:
        Run.objects.filter(pk=run.pk).update(**fields)
        for key, value in fields.items():
            setattr(run, key, value)
    return run


def run_cancel(run: Run, *, user=None) -> Run:
    """Ask a run to stop. Active runs go to `cancelling` and a task stops the Ray job; a finished run
    is refused (409); cancelling twice is harmless. An external run has no job: it is cancelled at once."""
    reason = f"cancel requested by {user_label(user)}"
    if run.is_external:
        external_run_cancel(run, reason)
        run.refresh_from_db()
        return run
    for _ in range(5):  # each lost race re-reads the state; the machine has no cycles, so this ends
        state = Run.objects.filter(pk=run.pk).values_list("state", flat=True).first()
        if state is None or state in TERMINAL_STATES:
            raise IllegalTransition(f"the run already ended ({state}); there is nothing to cancel", state or "missing")
        if state == S.CANCELLING:
            break
        if state == S.DRAFT or (state in (S.QUEUED, S.PREEMPTED) and settings.SCHEDULER == "admission"):
            # Not admitted (or preempted and stopped): no Ray job exists, nothing to stop. Admission
            # moves queued runs with a compare-and-set too, so exactly one of the two wins.
            if run_transition(run.pk, [state], S.CANCELLED, reason):
                break
            continue
        with transaction.atomic():
            if run_transition(run.pk, [state], S.CANCELLING, reason):
                transaction.on_commit(lambda: dispatch.run_task("run_cancel", run.pk))
                break
    run.refresh_from_db()
    return run


def user_label(user) -> str:
    return getattr(user, "username", None) or "someone"
