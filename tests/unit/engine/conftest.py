"""Engine test fixtures: a tiny demo task (Qwen2 architecture, trained tokenizer), built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rl_engine.demo.build import build_demo

    out = tmp_path_factory.mktemp("tiny-demo")
    # A few supervised steps only: the policy must emit varied digit strings so rewards differ
    # within a group and the updates are not all zero.
    build_demo(out, seed=0, model_size="tiny", sft_steps=10, progress=False)
    return out


def stop_at_first_checkpoint(straight: Path, stopped: Path, step: int) -> None:
    """Makes `stopped` the run folder `straight` was when its step-`step` checkpoint (its first) was
    written: that checkpoint and the events up to it, as a run killed right after it would leave."""
    import json
    import shutil

    shutil.copytree(straight / "checkpoints" / f"step_{step}", stopped / "checkpoints" / f"step_{step}")
    lines = (straight / "events.jsonl").read_text().splitlines(keepends=True)
    upto = next(i for i, line in enumerate(lines) if json.loads(line)["type"] == "checkpoint")
    (stopped / "events.jsonl").write_text("".join(lines[: upto + 1]))
