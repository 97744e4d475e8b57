"""Writes of external runs: runs of another engine (TRL, OpenRLHF, verl, a script) tracked through
the SDK. No Ray job and no Celery dispatch: the client posts its events to the same ingestion
endpoint as the engine, with the run's own token, and its `status` events drive the state; when its
heartbeats stop for RUN_HEARTBEAT_TIMEOUT_S the periodic reconcile fails the run as lost."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from posttrain.core.errors import IllegalTransition, InvalidInput
from posttrain.core.run_tokens import ingest_token, token_hash
from posttrain.projects.models import Project
from posttrain.runs.models import Experiment, Run, RunKind, RunState, RunTransition
from posttrain.runs.services.experiments import nul_at
from posttrain.runs.services.run_fields import clean_note, clean_tags
from posttrain.runs.services.state_machine import LOST_REASON_PREFIX, run_transition

MAX_CONFIG_BYTES = 1 << 20
_ENGINE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")


@dataclass(frozen=True)
class ExternalRun:
    run: Run
    ingest_token: str


def _clean_engine(engine: Any) -> str:
    if not isinstance(engine, str) or not engine.strip():
        raise InvalidInput.one("engine", "required: what trains the run (trl, openrlhf, verl, python, ...)")
    engine = engine.strip().lower()
    if len(engine) > 50 or not set(engine) <= _ENGINE_CHARS:
        raise InvalidInput.one("engine", "at most 50 lowercase letters, digits and - _ .")
    if engine == "posttrain":
        raise InvalidInput.one("engine", "posttrain runs are launched from an experiment, not tracked")
    return engine


def _clean_config(config: Any) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise InvalidInput.one("config", f"must be an object, got {type(config).__name__}")
    nul = nul_at(config)
    if nul is not None:
        raise InvalidInput.one(f"config.{nul}", "contains a NUL character")
    if len(json.dumps(config, default=str)) > MAX_CONFIG_BYTES:
        raise InvalidInput.one("config", f"at most {MAX_CONFIG_BYTES} bytes of JSON")
    return config


def _lock_experiment_name(project: Project, name: str) -> None:
    """Clients that start runs of a new experiment at once must find one experiment, not make one each (or see
    each other's half-made one as an experiment of Posttrain runs): a transaction lock per project and name,
    held until the run is created. SQLite has one writer at a time already."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", [f"posttrain-external-experiment:{project.pk}:{name}"]
            )


def _experiment_for(name: Any, project: Project, user) -> Experiment:
    """The experiment without a model that groups the project's external runs of that name (made on first use)."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput.one("experiment", "required")
    name = name.strip()[:200]
    _lock_experiment_name(project, name)
    named = Experiment.objects.filter(project=project, name=name)
    existing = named.filter(model__isnull=True).order_by("pk").first()
    if existing is not None:
        return existing
    if named.exists():
        raise InvalidInput.one(
            "experiment", f"{name!r} is an experiment of Posttrain runs; name the external runs' experiment differently"
        )
    return Experiment.objects.create(
        project=project,
        name=name,
        description="External runs tracked through the SDK.",
        config={},
        created_by=user if getattr(user, "is_authenticated", False) else None,
    )


def external_run_create(
    *,
    project: Project,
    experiment: str,
    name: str = "",
    config: Any = None,
    engine: Any = "python",
    tags: Any = None,
    note: Any = None,
    total_steps: int | None = None,
    user=None,
) -> ExternalRun:
    """A running external run and its ingestion token (shown once, to the client that asked)."""
    engine = _clean_engine(engine)
    config = _clean_config({} if config is None else config)
    tags, note = clean_tags(tags), clean_note(note)
    if total_steps is not None and (
        isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1
    ):
        raise InvalidInput.one("total_steps", "must be a positive integer")
    run_id = uuid.uuid4()
    reason = f"tracked from {engine} by {getattr(user, 'username', None) or 'someone'}"
    now = timezone.now()
    with transaction.atomic():
        grouping = _experiment_for(experiment, project, user)
        number = Run.objects.filter(experiment=grouping).count() + 1
        run = Run.objects.create(
            id=run_id,
            experiment=grouping,
            project=project,
            kind=RunKind.EXTERNAL,
            engine=engine,
            total_steps=total_steps,
            name=(name or "").strip()[:200] or f"{grouping.name} #{number}"[:200],
            state=RunState.RUNNING,
            state_reason=reason,
            started_at=now,
            resolved_config=config,
            tags=tags,
            note=note,
            ingest_token_hash=token_hash(ingest_token(run_id)),
            created_by=user if getattr(user, "is_authenticated", False) else None,
        )
        RunTransition.objects.create(run=run, from_state=RunState.DRAFT, to_state=RunState.RUNNING, reason=reason)
    return ExternalRun(run, ingest_token(run_id))


def external_runs_fail_lost(now=None) -> int:
    """Fails every running external run whose client sent nothing (not even a heartbeat) for
    RUN_HEARTBEAT_TIMEOUT_S: the W&B "crashed" of a process that was killed or lost its network."""
    timeout = float(settings.RUN_HEARTBEAT_TIMEOUT_S)
    stale = (now or timezone.now()) - timedelta(seconds=timeout)
    failed = 0
    candidates = Run.objects.filter(kind=RunKind.EXTERNAL, state=RunState.RUNNING)
    for run in candidates.only("pk", "last_event_at", "state_changed_at"):
        last = run.last_event_at or run.state_changed_at
        if last is not None and last < stale:
            reason = (
                f"{LOST_REASON_PREFIX}the client sent nothing for {timeout:g}s (its process ended without finish(), "
                "or lost the network; it runs again if its client is heard)"
            )
            failed += run_transition(run.pk, [RunState.RUNNING], RunState.FAILED, reason)
    return failed


def external_run_cancel(run: Run, reason: str) -> None:
    """There is no job to stop: the run ends at once; whatever its client still sends is stored, but
    its final status cannot change the state any more."""
    if not run_transition(run.pk, [RunState.RUNNING], RunState.CANCELLED, f"{reason} (its client is not stopped)"):
        run.refresh_from_db(fields=["state"])
        raise IllegalTransition(f"the run already ended ({run.state}); there is nothing to cancel", run.state)


def refuse_external(run: Run, what: str) -> None:
    if run.is_external:
        raise IllegalTransition(
            f"an external run ({run.engine}) cannot be {what}: Posttrain has no config of it to launch", run.state
        )
