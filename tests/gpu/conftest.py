"""GPU tests: `make test-gpu` on a host with CUDA (and, for the vLLM ones, vllm built for CUDA); every test
here is skipped where torch sees no GPU, so the suite stays green on CPU hosts. The `tiny_demo` task they
train is tests/conftest.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The hook sees the whole session's items: only this folder's are GPU tests.
    skip = pytest.mark.skip(reason="no CUDA GPU visible (torch.cuda.is_available() is False)")
    for item in items:
        if HERE not in Path(item.fspath).parents:
            continue
        item.add_marker(pytest.mark.gpu)
        if not torch.cuda.is_available():
            item.add_marker(skip)
