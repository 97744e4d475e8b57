"""The checkpoint folder layout (`runs/<id>/checkpoints/step_<n>/`): the engine writes it
(rl_engine.checkpoint), the platform reads it to resume a run, register a checkpoint as a model, or tell a
checkpoint's step."""

from __future__ import annotations

import re
from pathlib import Path

ENGINE_STATE = "engine_state.pt"  # beside the Hugging Face model: optimizer, data position, RNG
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step}"


def checkpoint_step(path: str | Path | None) -> int | None:
    """The step of a checkpoint folder (`…/checkpoints/step_<n>`); None for any other path."""
    found = _STEP_DIR.match(Path(str(path).rstrip("/")).name) if path else None
    return int(found.group(1)) if found else None


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    found = [(step, p) for p in root.iterdir() if p.is_dir() and (step := checkpoint_step(p)) is not None]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None
