"""What other apps do when a run changes state, registered by them (their AppConfig.ready) so that runs, the lower
layer, never imports them (docs/ARCHITECTURE.md, "Apps import one way"): telemetry seals the run's metrics and tells
open run pages, scheduling admits waiting runs when resources came free.

Two moments, each called in registration order (INSTALLED_APPS' order of ready()):
- `in_run_transition`: inside the move's transaction, under the row lock its compare-and-set took (no ingest of the
  run runs meanwhile), after the RunTransition row is written;
- `on_run_transition`: after that transaction commits (transaction.on_commit), so no one hears of a move that was
  rolled back."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from django.db import transaction


@dataclass(frozen=True)
class RunMove:
    """One recorded state change of a run."""

    run_id: uuid.UUID | str
    from_state: str
    to_state: str
    reason: str


RunMoveHook = Callable[[RunMove], None]

_IN_TRANSACTION: list[RunMoveHook] = []
_AFTER_COMMIT: list[RunMoveHook] = []


def in_run_transition(hook: RunMoveHook) -> RunMoveHook:
    """Call `hook` inside every run move's transaction. Registering the same hook again changes nothing (ready() may
    run twice in tests)."""
    if hook not in _IN_TRANSACTION:
        _IN_TRANSACTION.append(hook)
    return hook


def on_run_transition(hook: RunMoveHook) -> RunMoveHook:
    """Call `hook` after every run move's transaction commits. Registering it again changes nothing."""
    if hook not in _AFTER_COMMIT:
        _AFTER_COMMIT.append(hook)
    return hook


def run_moved(move: RunMove) -> None:
    """The state machine's one call per recorded move, inside its transaction."""
    for hook in _AFTER_COMMIT:  # queued first: on_commit keeps this order whatever the in-transaction hooks queue
        transaction.on_commit(partial(hook, move))
    for hook in _IN_TRANSACTION:
        hook(move)
