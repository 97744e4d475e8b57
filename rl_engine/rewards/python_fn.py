"""User reward code from a Python file, run in a separate, limited, long-lived process.

Both shapes people already have work unchanged (docs/ARCHITECTURE.md, "Reward functions"):

- OpenRLHF, batched: ``reward_func(queries, prompts, labels, **kwargs)`` returning a list or
  tensor of rewards, or ``{"rewards": ..., "scores": ..., "extra_logs": {name: value | list}}``.
  Extra keyword arguments ``responses``, ``finish_reasons`` and ``metadata`` are passed when the
  function takes ``**kwargs`` or names them. ``rewards`` are the scores (``scores`` is used when
  ``rewards`` is missing); when both are given, ``scores`` is logged as an extra curve.
- verl, per sample: ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``
  returning a number or a dict with ``score`` (its other numeric keys become extra curves).
  ``data_source`` comes from the sample's metadata, ``solution_str`` is the response,
  ``ground_truth`` the label, and ``extra_info`` is ``metadata["extra_info"]`` when the row has
  one, else the whole metadata dict. Called with keywords like verl does (positional fallback
  for functions that name their parameters differently).

Isolation and failures. The function runs in a child interpreter, inside a bubblewrap sandbox
(``rl_engine/sandbox.py``: no network, no view of the platform's files or processes, a cleared
environment, limits on processes, memory, CPU time, open files and file size), that executes
``_sandbox.py`` by path: only the standard library is loaded before the user's file, so torch
is imported only if the user's code does. The sandbox holds copies of ``_sandbox.py`` and of the
user's file (at ``/sandbox/<name>``), nothing else of this host's files but the Python runtime.
The child is a plain subprocess speaking ``multiprocessing.connection`` frames of JSON over two
pipes, not a multiprocessing "spawn" or "forkserver" context, because those re-import the
parent's ``__main__`` in the child (a training script or a Ray worker's main, which import torch
and more). Its address space is capped (``RLIMIT_AS`` = ``memory_mb``), so a runaway allocation
becomes a ``MemoryError``. What it prints reaches our stderr, rate-limited. The child is kept
across batches (start-up once, then only pipe round trips) and replaced after a timeout, a
crash, a MemoryError or half its CPU-time limit. Nothing here raises out of ``score``: a problem
fails the affected samples with a reason (no sandbox available included).

Time limits. ``timeout_s`` bounds each call of the user function: the whole batch for the
OpenRLHF shape, each sample for the verl shape. Two layers enforce it:
1. inside the child, SIGALRM interrupts the call at ``timeout_s`` (pure-Python loops, sleeps):
   the sample (or batch) fails with "timeout after Ns" and the same process goes on;
2. the parent waits at most ``timeout_s + HARD_KILL_GRACE_S`` for each reply (each sample's
   reply in per-sample mode). If it does not come (code stuck in C, or a library that took over
   SIGALRM), the parent kills the child, fails that one sample (or the batch), starts a new
   child and continues with the samples that were not scored yet.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import weakref
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from rl_engine.rewards._sandbox import OPENRLHF_NAME, VERL_NAME, syntax_problem
from rl_engine.rewards.base import (
    ComponentResult,
    RewardBatch,
    parse_openrlhf_output,
    to_score,
    truncate_reason,
)
from rl_engine.sandbox import RUN_DIR, Limits, OutputRelay, Sandbox, SandboxUnavailable, died_by_signal

HARD_KILL_GRACE_S = 2.0
MAX_REPLY_BYTES = 64 << 20  # a reply frame larger than this is the child misbehaving
MIN_START_TIMEOUT_S = 30.0  # importing the user's file may import heavy libraries
# The child runs _sandbox.py by path, as __main__, without importing the rl_engine package:
# nothing but the standard library is loaded before the user's file. (Running the file as a
# script would put this folder, whose http.py shadows the stdlib, on sys.path; run_path does not.)
_SANDBOX_FILE = str(Path(__file__).with_name("_sandbox.py"))
_CHILD_BOOT = "import runpy, sys; path = sys.argv.pop(1); runpy.run_path(path, run_name='__main__')"


class WorkerTimeout(Exception):
    pass


class WorkerDied(Exception):
    pass


class WorkerLoadError(Exception):
    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


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


def _exit_reason(returncode: int | None, sandboxed: bool) -> str:
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


def _terminate(proc: subprocess.Popen, *conns: Connection) -> None:
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.close()
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


class SandboxWorker:
    """One child process running ``_sandbox`` in a sandbox (``rl_engine.sandbox``): start, request/reply
    with deadlines, kill. ``config["path"]`` is the user's file on this host; the child gets its copy.
    Raises SandboxUnavailable when user code may not run here."""

    def __init__(self, config: dict, start_timeout_s: float, limits: Limits | None = None):
        limits = limits or Limits(memory_mb=float(config["memory_mb"]))
        box = Sandbox.create(limits)
        self.sandboxed = box.sandboxed
        boot = box.add_file(_SANDBOX_FILE, RUN_DIR)
        config = {**config, "path": box.add_file(config["path"])}
        parent_read, child_write = os.pipe()
        child_read, parent_write = os.pipe()
        isolated = ["-I"] if box.sandboxed else []
        try:
            self.proc = box.popen(
                [sys.executable, *isolated, "-c", _CHILD_BOOT, boot, str(child_read), str(child_write)],
                pass_fds=(child_read, child_write),
            )
        except BaseException:
            for fd in (parent_read, child_write, child_read, parent_write):
                os.close(fd)
            raise
        os.close(child_read)
        os.close(child_write)
        self._output = OutputRelay(self.proc.stdout, label=Path(config["path"]).name)
        self._inbox = Connection(parent_read, writable=False)
        self._outbox = Connection(parent_write, readable=False)
        self._finalizer = weakref.finalize(self, _terminate, self.proc, self._inbox, self._outbox)
        try:
            self.send(config)
            reply = self.recv(start_timeout_s)
        except WorkerTimeout:
            self.kill()
            raise WorkerLoadError([f"loading the file took longer than {start_timeout_s:g}s"]) from None
        except WorkerDied as exc:
            self.kill()
            raise WorkerLoadError([f"loading the file failed: {exc}"]) from None
        if reply.get("op") != "ready":
            self.kill()
            raise WorkerLoadError(list(reply.get("problems") or ["unexpected reply from the worker"]))
        self.function: str = reply["function"]
        self.batch: bool = reply["batch"]

    def send(self, message: dict) -> None:
        try:
            self._outbox.send_bytes(json.dumps(message, default=_json_default).encode())
        except OSError as exc:  # BrokenPipeError: the child is gone
            raise WorkerDied(self._died_reason()) from exc

    def recv(self, timeout_s: float) -> dict:
        try:
            if not self._inbox.poll(timeout_s):
                raise WorkerTimeout()
            return json.loads(self._inbox.recv_bytes(MAX_REPLY_BYTES))
        except (EOFError, OSError, ValueError, RecursionError) as exc:  # gone, or a reply we cannot read
            raise WorkerDied(self._died_reason()) from exc

    def _died_reason(self) -> str:
        try:
            returncode = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            returncode = None
        return _exit_reason(returncode, self.sandboxed)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, wait_s: float = 1.0) -> None:
        if self.alive:
            try:
                self._outbox.send_bytes(b'{"op": "close"}')
                self.proc.wait(timeout=wait_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        self._finalizer()


def check_syntax(path: str | os.PathLike) -> list[str]:
    """Problems found without running anything: missing file, not readable, syntax errors."""
    file = Path(path)
    if not file.is_file():
        return [f"file not found: {file}"]
    try:
        source = file.read_bytes()
    except OSError as exc:
        return [f"cannot read {file}: {exc.strerror}"]
    try:
        compile(source, str(file), "exec", dont_inherit=True)
    except SyntaxError as exc:
        return [syntax_problem(exc)]
    except ValueError as exc:  # e.g. null bytes
        return [f"not a Python source file: {exc}"]
    return []


def check_reward_file(
    path: str | os.PathLike, function: str | None = None, timeout_s: float = 30.0, memory_mb: float = 1024
) -> list[str]:
    """Problems with a reward file, found by importing it in a sandboxed child ([] = usable).

    Reports a syntax error with its line, an exception at import time with its line, a missing
    function (``reward_func``/``compute_score``, or ``function``) and a signature that cannot
    take the OpenRLHF or verl arguments. Does not call the function.
    """
    problems = check_syntax(path)
    if problems:
        return problems
    config = _child_config(path, function, None, timeout_s, memory_mb)
    try:
        worker = SandboxWorker(config, start_timeout_s=timeout_s)
    except WorkerLoadError as exc:
        return exc.problems
    except SandboxUnavailable as exc:
        return [str(exc)]
    except OSError as exc:
        return [f"cannot start the sandbox: {exc}"]
    worker.close()
    return []


def _child_config(
    path: str | os.PathLike, function: str | None, batch: bool | None, timeout_s: float, memory_mb: float
) -> dict:
    return {
        "path": str(Path(path).resolve()),
        "function": function,
        "batch": batch,
        "timeout_s": timeout_s,
        "memory_mb": memory_mb,
    }


class PythonFunctionReward:
    """A reward function from a user's file; see the module docstring for shapes and limits.

    ``memory_mb`` caps the child's *address space*, which is larger than its resident memory:
    importing torch alone reserves about 0.6 GB, CUDA libraries far more, so raise it for
    reward code that imports heavy libraries.

    ``batch=None`` (default) picks the shape from the function: ``reward_func`` or a first
    parameter named ``queries`` is batched (OpenRLHF), ``compute_score`` or a ``solution_str``
    parameter is per sample (verl). The constructor only checks the file exists and compiles
    (a syntax error raises ValueError naming the line); the child starts on first use or
    :meth:`start`.
    """

    def __init__(
        self,
        path: str,
        name: str = "python",
        function: str | None = None,
        timeout_s: float = 30.0,
        memory_mb: float = 1024,
        batch: bool | None = None,
    ):
        problems = check_syntax(path)
        if problems:
            raise ValueError(f"path: {problems[0]}")
        if not timeout_s or timeout_s <= 0:
            raise ValueError("timeout_s: must be positive")
        if not memory_mb or memory_mb < 64:
            raise ValueError("memory_mb: must be at least 64 (the interpreter itself needs some)")
        self.name = name
        self.path = str(Path(path).resolve())
        self.function = function
        self.timeout_s = float(timeout_s)
        self.memory_mb = float(memory_mb)
        self.batch = batch
        self._worker: SandboxWorker | None = None
        self._lock = threading.Lock()

    # -- worker lifecycle --

    def start(self) -> None:
        """Start the child now; raises ValueError with the load problems (import error, missing
        function, wrong signature). The engine can call it before the first step to fail early."""
        with self._lock:
            try:
                self._ensure_worker()
            except WorkerLoadError as exc:
                raise ValueError(f"path: {'; '.join(exc.problems)}") from None

    def _ensure_worker(self) -> SandboxWorker:
        if self._worker is not None and not self._worker.alive:
            self._worker.kill()
            self._worker = None
        if self._worker is None:
            config = _child_config(self.path, self.function, self.batch, self.timeout_s, self.memory_mb)
            self._worker = SandboxWorker(config, start_timeout_s=max(MIN_START_TIMEOUT_S, self.timeout_s))
        return self._worker

    def _drop_worker(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker = None

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.close()
                self._worker = None

    @property
    def worker_pid(self) -> int | None:
        """The child's pid (None when not running); lets tests and ops see reuse/restarts."""
        worker = self._worker
        return worker.proc.pid if worker is not None and worker.alive else None

    # -- scoring --

    def score(self, batch: RewardBatch) -> ComponentResult:
        n = len(batch)
        if n == 0:
            return ComponentResult.ok([])
        with self._lock:
            try:
                worker = self._ensure_worker()
            except WorkerLoadError as exc:
                self._worker = None
                return ComponentResult.failed(n, f"loading {Path(self.path).name} failed: {'; '.join(exc.problems)}")
            except SandboxUnavailable as exc:
                return ComponentResult.failed(n, str(exc))
            except OSError as exc:
                return ComponentResult.failed(n, f"cannot start the sandbox: {exc}")
            try:
                if worker.batch:
                    return self._score_batched(batch)
                return self._score_per_sample(batch)
            except Exception as exc:  # e.g. a batch that cannot be encoded; keep the promise not to raise
                self._drop_worker()
                return ComponentResult.failed(n, f"{type(exc).__name__}: {exc}")

    def _deadline(self) -> float:
        return self.timeout_s + HARD_KILL_GRACE_S

    def _score_batched(self, batch: RewardBatch) -> ComponentResult:
        n = len(batch)
        request = {
            "op": "batch",
            "kwargs": {
                "queries": batch.queries,
                "prompts": batch.prompts,
                "labels": batch.labels,
                "responses": batch.responses,
                "finish_reasons": batch.finish_reasons,
                "metadata": batch.metadata,
            },
        }
        try:
            reply = self._request_with_one_restart(request)
        except WorkerTimeout:
            self._drop_worker()
            return ComponentResult.failed(n, f"timeout after {self.timeout_s:g}s")
        except WorkerDied as exc:
            self._drop_worker()
            return ComponentResult.failed(n, str(exc))
        except WorkerLoadError as exc:
            return ComponentResult.failed(n, f"loading {Path(self.path).name} failed: {'; '.join(exc.problems)}")
        if reply.get("restart"):
            self._drop_worker()
        if reply.get("op") == "error":
            return ComponentResult.failed(n, reply.get("reason") or "unknown error")
        try:
            return parse_openrlhf_output(reply.get("value"), n)
        except ValueError as exc:
            return ComponentResult.failed(n, str(exc))

    def _send_with_one_restart(self, request: dict) -> SandboxWorker:
        """Send one request; if the idle child had died since the last batch, start a new one
        and resend once (the request never reached user code, so it is safe to repeat)."""
        worker = self._ensure_worker()
        try:
            worker.send(request)
        except WorkerDied:
            self._drop_worker()
            worker = self._ensure_worker()
            worker.send(request)
        return worker

    def _request_with_one_restart(self, request: dict) -> dict:
        return self._send_with_one_restart(request).recv(self._deadline())

    def _score_per_sample(self, batch: RewardBatch) -> ComponentResult:
        n = len(batch)
        scores = [0.0] * n
        errors: list[str | None] = [None] * n
        extra: dict[str, list[float]] = {}
        items = [[i, _verl_args(batch, i)] for i in range(n)]
        pending = list(range(n))
        while pending:
            try:
                worker = self._request_samples(items, pending)
            except WorkerLoadError as exc:
                reason = f"loading {Path(self.path).name} failed: {'; '.join(exc.problems)}"
                for i in pending:
                    errors[i] = reason
                break
            except WorkerDied as exc:
                for i in pending:
                    errors[i] = str(exc)
                break
            # Read one reply per sample, each with its own deadline; the sample in progress
            # is always pending[0] because the child answers in order.
            while pending:
                try:
                    reply = worker.recv(self._deadline())
                except (WorkerTimeout, WorkerDied) as exc:
                    errors[pending.pop(0)] = (
                        f"timeout after {self.timeout_s:g}s" if isinstance(exc, WorkerTimeout) else str(exc)
                    )
                    self._drop_worker()
                    break  # a fresh child takes the rest
                if reply.get("op") != "sample" or reply.get("index") != pending[0]:
                    for i in pending:
                        errors[i] = "unexpected reply from the worker"
                    self._drop_worker()
                    pending = []
                    break
                index = pending.pop(0)
                if reply.get("ok"):
                    try:
                        scores[index], sample_extra = _verl_value(reply.get("value"))
                    except (TypeError, ValueError) as exc:
                        errors[index] = str(exc)
                    else:
                        for key, value in sample_extra.items():
                            extra.setdefault(key, []).append(value)
                else:
                    errors[index] = reply.get("reason") or "unknown error"
            else:
                self._finish_samples()
        return ComponentResult(scores, [None if e is None else truncate_reason(e) for e in errors], extra)

    def _request_samples(self, items: list, pending: list[int]) -> SandboxWorker:
        return self._send_with_one_restart({"op": "samples", "items": [items[i] for i in pending]})

    def _finish_samples(self) -> None:
        """Read the child's end-of-batch marker (it may ask to be replaced)."""
        worker = self._worker
        if worker is None:
            return
        try:
            done = worker.recv(self._deadline())
        except (WorkerTimeout, WorkerDied):
            self._drop_worker()
            return
        if done.get("op") != "done" or done.get("restart"):
            self._drop_worker()


def _verl_args(batch: RewardBatch, i: int) -> dict:
    metadata = batch.metadata[i] or {}
    extra_info = metadata.get("extra_info", metadata)
    return {
        "data_source": metadata.get("data_source"),
        "solution_str": batch.responses[i],
        "ground_truth": batch.labels[i],
        "extra_info": extra_info,
    }


def _verl_value(value: Any) -> tuple[float, dict[str, float]]:
    """(score, extra) from a verl return value: a number, or a dict with ``score``."""
    if isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"returned a dict without 'score' (keys: {sorted(value)[:8]})")
        extra = {k: float(v) for k, v in value.items() if k != "score" and isinstance(v, (int, float))}
        return to_score(value["score"]), extra
    return to_score(value), {}


__all__ = [
    "PythonFunctionReward",
    "check_reward_file",
    "OPENRLHF_NAME",
    "VERL_NAME",
]
