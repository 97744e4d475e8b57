"""Helpers of the engine tests that are not fixtures (the shared `tiny_demo` task is in tests/conftest.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def stop_at_first_checkpoint(straight: Path, stopped: Path, step: int) -> None:
    """Makes `stopped` the run folder `straight` was when its step-`step` checkpoint (its first) was
    written: that checkpoint and the events up to it, as a run killed right after it would leave."""
    shutil.copytree(straight / "checkpoints" / f"step_{step}", stopped / "checkpoints" / f"step_{step}")
    lines = (straight / "events.jsonl").read_text().splitlines(keepends=True)
    upto = next(i for i, line in enumerate(lines) if json.loads(line)["type"] == "checkpoint")
    (stopped / "events.jsonl").write_text("".join(lines[: upto + 1]))
