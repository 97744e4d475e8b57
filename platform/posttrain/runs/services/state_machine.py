"""The run state machine: the only place a run changes state.

`run_transition` is a compare-and-set `UPDATE … WHERE state=<old>` recorded with a RunTransition row
(reason, time) in the same transaction; whoever loses a race sees 0 rows updated and decides again
from the fresh state. What other apps do on a move (seal the metrics, tell open run pages, admit waiting
runs) they register in posttrain.runs.hooks.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.utils import timezone

from posttrain.runs.hooks import RunMove, run_moved
from posttrain.runs.models import (
    TERMINAL_STATES,
    Run,
    RunKind,
    RunState,
    RunTransition,
)

S = RunState
ACTIVE_STATES = (S.STARTING, S.RUNNING, S.CANCELLING, S.PREEMPTING)  # a Ray job exists (or should)
WAITING_STATES = (S.QUEUED, S.PREEMPTED)  # in the scheduler's queue
# A native run leaving these frees cluster resources (scheduling's hook admits waiting runs at once).
HOLDING_STATES = frozenset(ACTIVE_STATES)
# The state machine (docs/ARCHITECTURE.md, "Run states"). Terminal states have no way out, with one exception
# outside this table: `run_revive_lost`.
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    S.DRAFT: frozenset({S.QUEUED, S.CANCELLED}),
    S.QUEUED: frozenset({S.STARTING, S.RUNNING, S.CANCELLING, S.CANCELLED, S.FAILED, S.SUCCEEDED}),
    # starting -> queued: Ray could not take the admitted job yet; it waits for the next admission.
    S.STARTING: frozenset({S.QUEUED, S.RUNNING, S.CANCELLING, S.SUCCEEDED, S.FAILED, S.CANCELLED}),
    S.RUNNING: frozenset({S.CANCELLING, S.PREEMPTING, S.SUCCEEDED, S.FAILED, S.CANCELLED}),
    S.CANCELLING: frozenset({S.CANCELLED, S.SUCCEEDED, S.FAILED}),
    # The engine checkpoints at its next step boundary and exits 75; a run that ends first just ends.
    S.PREEMPTING: frozenset({S.PREEMPTED, S.CANCELLING, S.SUCCEEDED, S.FAILED, S.CANCELLED}),
    S.PREEMPTED: frozenset({S.STARTING, S.CANCELLING, S.CANCELLED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}
REASON_LIMIT = 4000
# How an external run's silence is failed (external.py); a run failed so is revived when its client is heard.
LOST_REASON_PREFIX = "lost: "


def run_transition(run_id: uuid.UUID | str, from_states: Iterable[str], to_state: str, reason: str) -> bool:
    """Move a run from one of `from_states` to `to_state` if it is still there (compare-and-set).

    Returns True when this call made the change (and recorded it), False when the run was in another
    state: the caller lost a race or asked too late and must decide from the fresh state."""
    from_states = list(dict.fromkeys(from_states))
    for old in from_states:
        if to_state not in ALLOWED_TRANSITIONS[old]:
            raise ValueError(f"{old} -> {to_state} is not a transition of the run state machine")
    now = timezone.now()
    reason = (reason or "")[:REASON_LIMIT]
    fields: dict[str, Any] = {"state": to_state, "state_reason": reason, "state_changed_at": now}
    if to_state == S.RUNNING:
        fields["started_at"] = now
    if to_state in TERMINAL_STATES:
        fields["finished_at"] = now
    with transaction.atomic():
        for old in from_states:
            if Run.objects.filter(pk=run_id, state=old).update(**fields):
                _record_move(run_id, old, to_state, reason)
                return True
    return False


def run_revive_lost(run_id: uuid.UUID | str) -> bool:
    """An external run failed as lost whose client is heard again (an event batch, a rollout upload) runs
    again, as W&B's crashed run does when its heartbeats resume: the silence the server judged may have been
    its own (down, restarting, overloaded) while the client kept everything it could not send. A native run
    never comes back this way (Ray's job state decides it). Compare-and-set; True when this call revived it."""
    now = timezone.now()
    reason = "running again: its client was heard after the run was failed as lost"
    with transaction.atomic():
        revived = Run.objects.filter(
            pk=run_id, kind=RunKind.EXTERNAL, state=S.FAILED, state_reason__startswith=LOST_REASON_PREFIX
        ).update(state=S.RUNNING, state_reason=reason, state_changed_at=now, finished_at=None)
        if revived:
            _record_move(run_id, S.FAILED, S.RUNNING, reason)
    return bool(revived)


def _record_move(run_id: uuid.UUID | str, old: str, new: str, reason: str) -> None:
    """The move's RunTransition row, in the caller's transaction and under the row lock its update took; then
    the hooks other apps registered (posttrain.runs.hooks)."""
    RunTransition.objects.create(run_id=run_id, from_state=old, to_state=new, reason=reason)
    run_moved(RunMove(run_id=run_id, from_state=old, to_state=new, reason=reason))
