"""Private servers the fault tests may kill: the system Redis and Postgres are shared with everything else
on the machine, so a test that stops one starts its own instead. Also the environment of the fault suite's
stacks (FAULT_STACK_ENV)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Self

import pytest

from tests.support.stack import free_port

# The fault stacks' settings (tests/faults/conftest.py's and test_postgres_outage.py's): short enough that a test
# sees the platform react, long enough that a healthy engine never trips them.
FAULT_STACK_ENV = {
    "POSTTRAIN_RUN_QUEUED_GRACE_S": "3",  # a run whose submit task died with its worker is resubmitted
    "POSTTRAIN_RUN_HEARTBEAT_TIMEOUT_S": "120",  # the production default: faults must be noticed sooner
}


def wait_for_port(port: int, timeout_s: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server for port {port} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on port {port} after {timeout_s}s")


class PrivateRedis:
    """`redis-server` on its own port with no persistence; `kill()` then `start()` is a crash and a restart
    on the same address (what a client sees of a Redis outage)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            cwd=self.folder,
            stdout=(self.folder / "redis.log").open("a"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for_port(self.port, 30, self.process)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None


class SmallFilesystem:
    """A size-limited tmpfs mounted over `folder` (root only): a disk that fills up. `fill()` takes what is
    left, as another tenant's files would."""

    def __init__(self, folder: Path, size_mb: int):
        self.folder = folder
        self.size_mb = size_mb

    def __enter__(self) -> Self:
        self.folder.mkdir(parents=True, exist_ok=True)
        mount = shutil.which("mount")
        command = [mount or "mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.folder)]
        result = subprocess.run(command, check=False, capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a size-limited filesystem here (needs root): {result.stderr.strip()}")
        return self

    def fill(self) -> None:
        with (self.folder / "filler").open("wb") as filler:
            block = b"\0" * (1 << 20)
            try:
                while True:
                    filler.write(block)
                    filler.flush()
            except OSError:  # ENOSPC: full; the file keeps what fitted
                pass
        with (self.folder / "filler-tail").open("wb", buffering=0) as tail:
            try:
                while True:
                    tail.write(b"\0" * 4096)
            except OSError:
                pass

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["umount", "-l", str(self.folder)], check=False)
