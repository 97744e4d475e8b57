"""The run state machine: the only place a run changes state.

`run_transition` is a compare-and-set `UPDATE … WHERE state=<old>` recorded with a RunTransition row
(reason, time) in the same transaction; whoever loses a race sees 0 rows updated and decides again
from the fresh state. Open run pages learn of each change on the live channel after commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from posttrain.runs.models import (
    TERMINAL_STATES,
    Run,
    RunKind,
    RunState,
    RunTransition,
)
from posttrain.telemetry import live_channel, series

S = RunState
ACTIVE_STATES = (S.STARTING, S.RUNNING, S.CANCELLING, S.PREEMPTING)  # a Ray job exists (or should)
WAITING_STATES = (S.QUEUED, S.PREEMPTED)  # in the scheduler's queue
# A native run leaving these frees cluster resources: admission looks at the queue again at once.
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
                # (Not back to queued: Ray could not take the job, and asking again at once would spin.)
                frees = old in HOLDING_STATES and to_state not in HOLDING_STATES and to_state != S.QUEUED
                if frees and _is_native(run_id):
                    transaction.on_commit(lambda: _admit_now(run_id))
                if to_state in TERMINAL_STATES:  # under the row lock the update took: no ingest runs meanwhile
                    series.seal_tail(run_id)
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
    """The move's RunTransition row, in the caller's transaction; open run pages learn of it on the live
    channel after commit (the SSE stream re-reads the run)."""
    RunTransition.objects.create(run_id=run_id, from_state=old, to_state=new, reason=reason)
    change = {"type": "state", "run": str(run_id), "from_state": old, "state": new, "reason": reason}
    transaction.on_commit(partial(live_channel.publish, run_id, [change]))


def _is_native(run_id: uuid.UUID | str) -> bool:
    return Run.objects.filter(pk=run_id, kind=RunKind.NATIVE).exists()


def _admit_now(run_id: uuid.UUID | str) -> None:
    """Resources came free: a worker admits waiting runs now, not at the next reconcile."""
    from django.conf import settings

    from posttrain.core import dispatch

    if settings.SCHEDULER == "admission":
        dispatch.run_task("admit_runs", run_id)
