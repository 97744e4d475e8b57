"""Demo builds at the demo size, built once per test run and shared by the pytest-xdist workers.

A demo-size build is the slow part of several modules' set-up (the full warm start is ~35 s alone and minutes
under the suite's load), and the modules that need one would each build the same thing again. The first
worker to ask builds it under a file lock in the run's shared temporary folder; the others wait and read it.
Every user reads it and writes nothing inside it: a test that must change a build copies it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest


def _run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder this test run's workers share: under xdist each worker's basetemp is a child of it.

    Without xdist the basetemp itself, never its parent, which is shared by every pytest run of the user.
    """
    basetemp = tmp_path_factory.getbasetemp()
    return basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp


def shared_demo_build(
    tmp_path_factory: pytest.TempPathFactory, *, model_size: str = "demo", sft_steps: int | None = None
) -> Path:
    """The demo task built with seed 0 at `model_size` (`sft_steps` None: the size's own warm start, as
    `make demo` builds it), once for the whole run."""
    from rl_engine.demo.build import build_demo, existing_build

    root = _run_root(tmp_path_factory)
    name = f"shared-demo-{model_size}-sft-{'default' if sft_steps is None else sft_steps}"
    out = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if existing_build(out) is None:
            build_demo(out, seed=0, model_size=model_size, sft_steps=sft_steps, progress=False)
    return out
