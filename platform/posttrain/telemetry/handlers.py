"""What telemetry does when a run changes state: the handlers it registers on posttrain.runs.hooks (apps.py)."""

from __future__ import annotations

from posttrain.runs.hooks import RunMove
from posttrain.runs.models import TERMINAL_STATES
from posttrain.telemetry import live_channel, series


def seal_when_ended(move: RunMove) -> None:
    """A run that ended gets no more points: its metrics' tail is sealed now, in the move's transaction and under
    the row lock its compare-and-set took, so no ingest of the run runs meanwhile."""
    if move.to_state in TERMINAL_STATES:
        series.seal_tail(move.run_id)


def publish_move(move: RunMove) -> None:
    """Open run pages learn of the move on the live channel (after commit; the SSE stream re-reads the run)."""
    change = {
        "type": "state",
        "run": str(move.run_id),
        "from_state": move.from_state,
        "state": move.to_state,
        "reason": move.reason,
    }
    live_channel.publish(move.run_id, [change])
