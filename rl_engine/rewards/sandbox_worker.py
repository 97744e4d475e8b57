"""The parent's side of a sandboxed child (``_sandbox.py``): start it, talk to it under deadlines, end it.

Used by python rewards (``python_fn.py``), environments (``rl_engine/environments``) and, through them, the
import check and "Try it" on the platform's worker.

Deadlines. Every frame written to the child and read from it, byte by byte, happens before a deadline the
caller gives (non-blocking pipes and ``poll``): a child that sends half a frame, stops itself (SIGSTOP) or
never reads its requests costs the caller its call's deadline (``timeout_s`` + a fixed grace), never more.

Replies are bounded. A reply to a request about ``n`` items is at most ``REPLY_BASE_BYTES`` +
``REPLY_ITEM_BYTES`` × n bytes: a frame that announces more is refused at its 4-byte header, before a byte
of its body is read (a forged 60 MB frame costs the parent its header). The body must be ASCII JSON (the
child's ``json.dumps`` writes nothing else) with at most ``REPLY_BASE_VALUES`` + ``REPLY_ITEM_VALUES`` × n
values, counted (commas, colons, brackets and braces: an upper bound) before ``json.loads`` sees it. So
parsing one costs the parent at most the frame, its text, at most 4 bytes per character of the strings
in it, and at most ``MAX_BYTES_PER_VALUE`` per value: ``parse_bound(cap)``.

After each call the worker ends every process the call left in the sandbox (``finish_call``): its server
(the child) stays, anything it forked goes.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_engine.rewards._sandbox import FRAME_HEADER
from rl_engine.sandbox import (
    RUN_DIR,
    Limits,
    Sandbox,
    SandboxProcess,
    died_by_signal,
)
from rl_engine.user_output import MarkedOutput

REPLY_BASE_BYTES = 256 << 10
REPLY_ITEM_BYTES = 8 << 10
REPLY_BASE_VALUES = 4096
REPLY_ITEM_VALUES = 64
MAX_BYTES_PER_VALUE = 256  # a Python object made by json.loads, with its slot in a list or dict (measured: ≤ 232)
READ_CHUNK = 64 << 10
CLOSE_WAIT_S = 1.0
# The child runs _sandbox.py by path, as __main__, without importing the rl_engine package:
# nothing but the standard library is loaded before the user's file. (Running the file as a
# script would put this folder, whose http.py shadows the stdlib, on sys.path; run_path does not.)
_SANDBOX_FILE = str(Path(__file__).with_name("_sandbox.py"))
_CHILD_BOOT = "import runpy, sys; path = sys.argv.pop(1); runpy.run_path(path, run_name='__main__')"


class WorkerTimeout(Exception):
    pass


class WorkerDied(Exception):
    pass


class ReplyRefused(WorkerDied):
    """The child sent something that is not a reply we read (too large, not JSON, not ASCII)."""


class WorkerLoadError(Exception):
    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class ReplyCap:
    bytes: int
    values: int

    @classmethod
    def for_items(cls, items: int) -> ReplyCap:
        items = max(1, items)
        return cls(REPLY_BASE_BYTES + REPLY_ITEM_BYTES * items, REPLY_BASE_VALUES + REPLY_ITEM_VALUES * items)


def parse_bound(cap: ReplyCap) -> int:
    """The most one reply under `cap` can cost the parent in memory while it is read and parsed: the read
    buffer (the frame and one read chunk past it), the frame, its text, its strings (at most 4 bytes a
    character), its values."""
    return 3 * cap.bytes + READ_CHUNK + 4 * cap.bytes + MAX_BYTES_PER_VALUE * cap.values


def decode_reply(frame: bytes, cap: ReplyCap) -> dict:
    """A reply frame's JSON object, parsed only when it cannot cost more than `parse_bound(cap)`."""
    if not frame.isascii():
        raise ReplyRefused("the sandbox's reply is not ASCII JSON")
    values = frame.count(b",") + frame.count(b":") + frame.count(b"[") + frame.count(b"{") + 1
    if values > cap.values:
        raise ReplyRefused(f"the sandbox's reply holds more than {cap.values} values")
    try:
        reply = json.loads(frame)
    except (ValueError, RecursionError) as exc:
        raise ReplyRefused(f"the sandbox's reply is not JSON ({type(exc).__name__})") from None
    if not isinstance(reply, dict):
        raise ReplyRefused("the sandbox's reply is not a JSON object")
    return reply


class Channel:
    """Frames over two pipes, every read and write before a deadline (`time.monotonic()` seconds)."""

    def __init__(self, read_fd: int, write_fd: int):
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        self.read_fd, self.write_fd = read_fd, write_fd
        self._buffer = bytearray()

    def send(self, payload: bytes, deadline: float) -> None:
        """Raises WorkerTimeout when the child does not take it all in time, WorkerDied when it is gone."""
        view = memoryview(FRAME_HEADER.pack(len(payload)) + payload)
        while view:
            try:
                view = view[os.write(self.write_fd, view[: 1 << 20]) :]
                continue
            except BlockingIOError:
                pass
            except OSError as exc:  # BrokenPipeError: the child is gone
                raise WorkerDied(str(exc)) from exc
            self._wait(self.write_fd, select.POLLOUT, deadline)

    def recv(self, deadline: float, cap: ReplyCap) -> dict:
        """The next reply; WorkerTimeout when a whole frame has not come by the deadline, ReplyRefused when the
        frame is over `cap` (refused at its header) or not a reply, WorkerDied when the child is gone."""
        self._fill(FRAME_HEADER.size, deadline)
        (size,) = FRAME_HEADER.unpack_from(self._buffer)
        if size > cap.bytes:
            raise ReplyRefused(f"the sandbox's reply is larger than {cap.bytes} bytes ({size} announced)")
        end = FRAME_HEADER.size + size
        self._fill(end, deadline)
        frame = bytes(self._buffer[FRAME_HEADER.size : end])
        del self._buffer[:end]
        return decode_reply(frame, cap)

    def has_unread(self) -> bool:
        """Bytes the child sent that no request asked for."""
        if self._buffer:
            return True
        poller = select.poll()
        poller.register(self.read_fd, select.POLLIN)
        return any(event & select.POLLIN for _, event in poller.poll(0))

    def _fill(self, size: int, deadline: float) -> None:
        """Reads until the buffer holds `size` bytes (it never holds more than `size` + READ_CHUNK)."""
        while len(self._buffer) < size:
            try:
                chunk = os.read(self.read_fd, READ_CHUNK)
            except BlockingIOError:
                self._wait(self.read_fd, select.POLLIN, deadline)
                continue
            except OSError as exc:
                raise WorkerDied(str(exc)) from exc
            if not chunk:
                raise WorkerDied("the sandbox closed its reply pipe")
            self._buffer += chunk

    @staticmethod
    def _wait(fd: int, event: int, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise WorkerTimeout()
        poller = select.poll()
        poller.register(fd, event)
        poller.poll(max(1, int(left * 1000)))

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


_SIGNAL_HINTS = {
    "SIGKILL": " (killed: out of memory?)",
    "SIGXCPU": " (CPU time limit)",
    "SIGXFSZ": " (file size limit)",
}


def exit_reason(returncode: int | None, sandboxed: bool) -> str:
    if returncode is None:
        return "worker process stopped responding"
    number = died_by_signal(returncode, sandboxed)
    if number is not None:
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = str(number)
        return f"worker process died from signal {name}{_SIGNAL_HINTS.get(name, '')}"
    return f"worker process exited with code {returncode}"


def _terminate(proc: subprocess.Popen, channel: Channel) -> None:
    channel.close()
    if proc.poll() is None:
        proc.kill()  # a SandboxProcess: every process of the sandbox, and its cgroups
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


class SandboxWorker:
    """One child process running ``_sandbox`` in a sandbox (``rl_engine.sandbox``): start, request/reply
    under deadlines, end what each call left behind, kill. ``config["path"]`` is the user's file on this
    host; the child gets its copy. Raises SandboxUnavailable when user code may not run here."""

    def __init__(self, config: dict, start_timeout_s: float, limits: Limits | None = None):
        self.memory_mb = float(config["memory_mb"])
        limits = limits or Limits(memory_mb=self.memory_mb)
        box = Sandbox.create(limits)
        self.sandboxed = box.sandboxed
        boot = box.add_file(_SANDBOX_FILE, RUN_DIR)
        for extra in config.get("files") or ():  # beside the file, which imports them
            box.add_file(extra)
        config = {**{k: v for k, v in config.items() if k != "files"}, "path": box.add_file(config["path"])}
        parent_read, child_write = os.pipe()
        child_read, parent_write = os.pipe()
        isolated = ["-I"] if box.sandboxed else []
        try:
            self.proc: SandboxProcess = box.popen(
                [sys.executable, *isolated, "-c", _CHILD_BOOT, boot, str(child_read), str(child_write)],
                pass_fds=(child_read, child_write),
            )
        except BaseException:
            for fd in (parent_read, child_write, child_read, parent_write):
                os.close(fd)
            raise
        os.close(child_read)
        os.close(child_write)
        self._output = MarkedOutput(self.proc.stdout, label=Path(config["path"]).name)  # each line marked as user code
        self._channel = Channel(parent_read, parent_write)
        self._finalizer = weakref.finalize(self, _terminate, self.proc, self._channel)
        deadline = time.monotonic() + start_timeout_s
        try:
            self.send(config, deadline)
            reply = self.recv(deadline)
        except WorkerTimeout:
            self.kill()
            raise WorkerLoadError([f"loading the file took longer than {start_timeout_s:g}s"]) from None
        except WorkerDied as exc:
            self.kill()
            raise WorkerLoadError([f"loading the file failed: {exc}{self._output_tail()}"]) from None
        if reply.get("op") != "ready":
            self.kill()
            raise WorkerLoadError([str(p) for p in reply.get("problems") or ["unexpected reply from the worker"]])
        self.function: str = reply["function"]
        self.batch: bool = reply["batch"]

    def send(self, message: dict, deadline: float) -> None:
        try:
            self._channel.send(json.dumps(message, default=_json_default).encode(), deadline)
        except WorkerDied as exc:
            raise WorkerDied(self._died_reason()) from exc

    def recv(self, deadline: float, items: int = 1) -> dict:
        """The next reply (to a request about `items` items), whole, before `deadline`."""
        try:
            return self._channel.recv(deadline, ReplyCap.for_items(items))
        except ReplyRefused:
            raise
        except WorkerDied as exc:
            raise WorkerDied(self._died_reason()) from exc

    def finish_call(self) -> bool:
        """After a call's last reply: ends every process the call left in the sandbox and checks that the
        child sent nothing more. False when this worker must not take the next call (kill it)."""
        return self.proc.kill_strays() and not self._channel.has_unread()

    def _died_reason(self) -> str:
        try:
            returncode = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            returncode = None
        cgroup = self.proc.cgroup
        if cgroup is not None and cgroup.oom_kills():
            return f"worker process was killed: out of memory (the sandbox's cap is {self.memory_mb:g} MB)"
        return exit_reason(returncode, self.sandboxed)

    def _output_tail(self) -> str:
        """What the child printed last, when it died loading (it sees only the user's file and the runtime)."""
        self._output.join(1.0)
        tail = self._output.tail().strip()
        return f": {tail}" if tail else ""

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        if self.alive:
            try:
                self._channel.send(b'{"op": "close"}', time.monotonic() + wait_s)
                self.proc.wait(timeout=wait_s)
            except (WorkerDied, WorkerTimeout, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        self._finalizer()
