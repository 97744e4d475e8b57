"""The Tinker service in a process of its own, for the benches that drive it with the official SDK."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from bench._servers import REPO

KEY = "tml-bench-key"


@contextmanager
def tinker_server(model: str, folder: Path, scratch: Path, stderr: IO[str] | int, *extra: str) -> Iterator[str]:
    """`python -m rl_engine.tinker serve` for `model` (a model folder), checkpoints in `scratch`; yields its URL."""
    (scratch / "key").write_text(KEY)
    server = subprocess.Popen(
        [sys.executable, "-m", "rl_engine.tinker", "serve", "--model", f"{model}={folder}"]
        + ["--root", str(scratch / "ck"), "--api-key-file", str(scratch / "key"), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},  # set, as the project keeps it
    )
    try:
        assert server.stdout is not None
        yield server.stdout.readline().strip().rsplit(" ", 1)[-1]  # "tinker service at <url>"
    finally:
        server.terminate()
        server.wait(timeout=30)
