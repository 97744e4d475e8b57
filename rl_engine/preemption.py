"""Preemption: the scheduler asks a run to make room, and the engine stops at its next step boundary with
a checkpoint it resumes from exactly (data position, optimizer, RNG, batches generated ahead).

The request is a file in the run folder (`PREEMPT_REQUEST`), written by whoever schedules the run (the
platform's Celery worker, which already writes the run's config there). A file rather than a signal:
Ray's job stop sends SIGTERM and kills a few seconds later, too soon for a step and a checkpoint; and a
file survives the engine being busy in a long generation or update, which then simply finishes first.
The engine exits with `EXIT_PREEMPTED` (75, EX_TEMPFAIL: "try again later") after its `preempted` status
event, so the scheduler can tell a preemption from a failure even when that event never arrived."""

from __future__ import annotations

from pathlib import Path

PREEMPT_REQUEST = "preempt.request"
EXIT_PREEMPTED = 75
EXIT_TIME_LIMIT = 124  # as timeout(1) exits: the run reached `train.max_wall_s`


class Preempted(Exception):
    """The run stopped at a step boundary for the scheduler; `checkpoint` resumes it."""

    exit_code = EXIT_PREEMPTED

    def __init__(self, step: int, checkpoint: Path):
        super().__init__(f"preempted after step {step}; resume from {checkpoint}")
        self.step = step
        self.checkpoint = checkpoint


class TimeLimitReached(Preempted):
    """The run stopped at a step boundary at its declared limit (`train.max_wall_s`); a stop by the clock
    rather than by the scheduler, with a checkpoint to resume from all the same. Its `failed` status event
    is out."""

    exit_code = EXIT_TIME_LIMIT


def time_limit_reason(train_time_s: float, max_wall_s: float | None, step: int) -> str | None:
    """Why the run stops now: its steps took `max_wall_s` or more (None: no limit, or not reached)."""
    if max_wall_s is None or train_time_s < max_wall_s:
        return None
    return (
        f"time limit: its training took {train_time_s:.0f} s, train.max_wall_s is {max_wall_s:g} s; "
        f"stopped after step {step} with a checkpoint (resume the run to go on)"
    )


def request_path(run_dir: Path) -> Path:
    return Path(run_dir) / PREEMPT_REQUEST


def request_preemption(run_dir: Path, reason: str) -> Path:
    """Ask the run in `run_dir` to checkpoint at its next step boundary and exit."""
    path = request_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reason + "\n")
    return path


def preemption_requested(run_dir: Path) -> str | None:
    """The request's reason when one is pending, else None."""
    try:
        return request_path(run_dir).read_text().strip() or "preemption requested"
    except FileNotFoundError:
        return None


def clear_request(run_dir: Path) -> None:
    """Forget a request (it was honoured, or it belongs to an attempt that already ended)."""
    request_path(run_dir).unlink(missing_ok=True)
