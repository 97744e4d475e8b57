"""A command that reports on a pipe (`run_reporting`): the report read until the command closes the pipe, under
a deadline and a size cap; the sandbox killed either way."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rl_engine.sandbox.box import Sandbox
from rl_engine.sandbox.output import OutputRelay


class ReportTooLarge(ValueError):
    """A command wrote more than the caller reads of its report."""


@dataclass(frozen=True)
class Reported:
    """What a reporting command left: its report, its exit code, whether it lingered after closing the pipe
    (then killed), and the last lines it printed (for a reason it failed)."""

    data: bytes
    returncode: int | None
    lingered: bool
    tail: str


def run_reporting(
    box: Sandbox,
    command: Callable[[int], Sequence[str]],
    *,
    timeout_s: float,
    max_bytes: int,
    label: str,
    env: Mapping[str, str] | None = None,
    exit_grace_s: float = 15.0,
) -> Reported:
    """Runs `command(fd)` in the sandbox, `fd` the write end of a pipe for its report, and reads the report
    until the command closes its end: TimeoutError once `timeout_s` pass, ReportTooLarge past `max_bytes`;
    either way the sandbox is killed. A command still running `exit_grace_s` after closing the pipe is killed
    too (its report is whole). What it prints is relayed to our stderr (OutputRelay)."""
    read_fd, write_fd = os.pipe()
    try:
        proc = box.popen(command(write_fd), env=env, pass_fds=(write_fd,))
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    os.close(write_fd)
    relay = OutputRelay(proc.stdout, label=label)
    lingered = False
    try:
        data = read_pipe(read_fd, time.monotonic() + timeout_s, max_bytes)
        try:
            proc.wait(timeout=exit_grace_s)
        except subprocess.TimeoutExpired:
            lingered = True
    finally:
        os.close(read_fd)
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)
    relay.join(1.0)
    return Reported(data, proc.returncode, lingered, relay.tail().strip())


def read_pipe(fd: int, deadline: float, max_bytes: int) -> bytes:
    """Everything written to the pipe `fd` until every writer has closed it: TimeoutError once `deadline`
    (time.monotonic()) passes, ReportTooLarge past `max_bytes`."""
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    size = 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the command did not finish in time")
        if not poller.poll(max(1, int(left * 1000))):
            continue
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            continue
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise ReportTooLarge(f"the command wrote over {max_bytes} bytes")
        chunks.append(chunk)
