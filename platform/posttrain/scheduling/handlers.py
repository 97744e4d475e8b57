"""What scheduling does for the apps below it: the handlers it registers (apps.py) on posttrain.runs.hooks (admission
when a run frees resources) and posttrain.telemetry.hooks (the preemption answers the ingest needs)."""

from __future__ import annotations

import uuid

from django.conf import settings

from posttrain.core import dispatch
from posttrain.runs.hooks import RunMove
from posttrain.runs.models import Run, RunKind
from posttrain.runs.services.state_machine import HOLDING_STATES, S
from posttrain.scheduling.services.preemption import preemption_forced, run_preemption_settle


def admit_when_freed(move: RunMove) -> None:
    """A native run that stopped holding cluster resources: a worker admits waiting runs now (after commit), not at
    the next reconcile. Not on a move back to queued: Ray could not take the job, and asking again at once would
    spin."""
    frees = move.from_state in HOLDING_STATES and move.to_state not in HOLDING_STATES and move.to_state != S.QUEUED
    if frees and settings.SCHEDULER == "admission" and _is_native(move.run_id):
        dispatch.run_task("admit_runs", move.run_id)


def _is_native(run_id: uuid.UUID | str) -> bool:
    return Run.objects.filter(pk=run_id, kind=RunKind.NATIVE).exists()


def preemption_settle(run_id: uuid.UUID, checkpoint: str | None, note: str) -> bool:
    """An engine that reported `preempted`: it checkpointed (at `checkpoint`, if it said) and left."""
    return run_preemption_settle(run_id, forced=False, checkpoint=checkpoint, note=note)


def stopped_at_preemption_deadline(run_id: uuid.UUID) -> bool:
    run = Run.objects.filter(pk=run_id, state=S.PREEMPTING).first()
    return run is not None and preemption_forced(run)
