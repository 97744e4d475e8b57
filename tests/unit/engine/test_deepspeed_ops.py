"""DeepSpeed's compiled ops are used only when they load, not merely when their library exists: a fused Adam built
for another GPU architecture or CUDA, or against another torch, is there but cannot be imported."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_engine.backends import deepspeed_trainer as ds


@pytest.fixture(scope="module")
def built_op() -> Path:
    """The op the set-up step builds on this CPU host (`make install` runs it): a real extension module."""
    ds.build_ops()
    built = ds._op_library("deepspeed_shm_comm")
    if not built.exists():
        pytest.skip("DeepSpeed needs no JIT op on this host")
    return built


def test_an_op_library_that_imports_loads(built_op):
    assert ds._load_problem(built_op) is None


def test_a_library_that_exists_but_does_not_import_is_said_not_to_load(tmp_path):
    broken = tmp_path / "fused_adam" / "fused_adam.so"
    broken.parent.mkdir()
    broken.write_bytes(b"\x7fELF truncated: built on another host")
    problem = ds._load_problem(broken)
    assert problem is not None and problem.startswith(f"{broken} does not load: ImportError")


def test_the_fused_adam_is_not_used_where_it_cannot_be_built_or_loaded(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    # A CPU host: DeepSpeed's accelerator is its CPU one, which has no fused Adam to build.
    assert ds.fused_adam_problem() == "no CUDA accelerator with nvcc for DeepSpeed's op builder"
    assert ds.fused_adam_ready() is False
