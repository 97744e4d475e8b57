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
