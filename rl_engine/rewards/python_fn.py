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
(``rl_engine/sandbox/``: no network, no view of the platform's files or processes, a cleared
environment, limits on processes, memory, CPU time, open files and file size), that executes
``_sandbox.py`` by path: only the standard library is loaded before the user's file, so torch
is imported only if the user's code does. The sandbox holds copies of ``_sandbox.py`` and of the
user's file (at ``/sandbox/<name>``), nothing else of this host's files but the Python runtime.
The child is a plain subprocess speaking frames of JSON over two pipes
(``rl_engine/rewards/sandbox_worker.py``), not a multiprocessing "spawn" or "forkserver" context,
because those re-import the parent's ``__main__`` in the child (a training script or a Ray
worker's main, which import torch and more). ``memory_mb`` caps the sandbox's memory (its
cgroup: processes, /tmp, /dev/shm and memfds together) and each process's address space
(``RLIMIT_AS``, so a runaway allocation becomes a ``MemoryError``). What it prints reaches our
stderr, rate-limited. The child is kept across batches (start-up once, then only pipe round
trips) and replaced after a timeout, a crash, a MemoryError, a reply it should not have sent or
half its CPU-time limit; after every call, whatever processes the call forked are killed. Nothing
here raises out of ``score``: a problem fails the affected samples with a reason (no sandbox
available included).

Time limits. ``timeout_s`` bounds each call of the user function: the whole batch for the
OpenRLHF shape, each sample for the verl shape. Two layers enforce it:
1. inside the child, SIGALRM interrupts the call at ``timeout_s`` (pure-Python loops, sleeps):
   the sample (or batch) fails with "timeout after Ns" and the same process goes on;
2. the parent sends the request and reads each reply, whole, within ``timeout_s +
   HARD_KILL_GRACE_S`` (each sample's reply in per-sample mode; a child that stops, never reads
   or sends half a reply included). If it does not come (code stuck in C, or a library that took
   over SIGALRM), the parent kills the child, fails that one sample (or the batch), starts a new
   child and continues with the samples that were not scored yet.
"""

from __future__ import annotations

import os
import threading
import time
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
from rl_engine.rewards.sandbox_worker import (
    ReplyRefused,
    SandboxWorker,
    WorkerDied,
    WorkerLoadError,
    WorkerTimeout,
)
from rl_engine.sandbox import SandboxUnavailable

HARD_KILL_GRACE_S = 2.0
MIN_START_TIMEOUT_S = 30.0  # importing the user's file may import heavy libraries


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
    path: str | os.PathLike,
    function: str | None,
    batch: bool | None,
    timeout_s: float,
    memory_mb: float,
    files: list[str] | None = None,
) -> dict:
    return {
        "path": str(Path(path).resolve()),
        "files": [str(Path(f).resolve()) for f in files or ()],
        "function": function,
        "batch": batch,
        "timeout_s": timeout_s,
        "memory_mb": memory_mb,
    }


class PythonFunctionReward:
    """A reward function from a user's file; see the module docstring for shapes and limits.

    ``memory_mb`` caps the sandbox's memory (its processes, /tmp, /dev/shm and memfds together)
    and each process's *address space*, which is larger than its resident memory: importing
    torch alone reserves about 0.6 GB, CUDA libraries far more, so raise it for reward code that
    imports heavy libraries.

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
        files: list[str] | None = None,
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
        self.files = [str(Path(f).resolve()) for f in files or ()]  # shown read-only beside the file
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
            config = _child_config(self.path, self.function, self.batch, self.timeout_s, self.memory_mb, self.files)
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

    def _call_deadline(self) -> float:
        return time.monotonic() + self.timeout_s + HARD_KILL_GRACE_S

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
            worker, deadline = self._send_with_one_restart(request)
            reply = worker.recv(deadline, items=n)
        except WorkerTimeout:
            self._drop_worker()
            return ComponentResult.failed(n, f"timeout after {self.timeout_s:g}s")
        except WorkerDied as exc:
            self._drop_worker()
            return ComponentResult.failed(n, str(exc))
        except WorkerLoadError as exc:
            return ComponentResult.failed(n, f"loading {Path(self.path).name} failed: {'; '.join(exc.problems)}")
        self._finish_call(worker, bool(reply.get("restart")))
        if reply.get("op") == "error":
            return ComponentResult.failed(n, str(reply.get("reason") or "unknown error"))
        try:
            return parse_openrlhf_output(reply.get("value"), n)
        except ValueError as exc:
            return ComponentResult.failed(n, str(exc))

    def _send_with_one_restart(self, request: dict) -> tuple[SandboxWorker, float]:
        """Send one request (returns the worker and the call's deadline); if the idle child had died since
        the last batch, start a new one and resend once (the request never reached user code, so it is safe
        to repeat; the new child's start does not count against the call)."""
        worker = self._ensure_worker()
        deadline = self._call_deadline()
        try:
            worker.send(request, deadline)
        except WorkerDied:
            self._drop_worker()
            worker = self._ensure_worker()
            deadline = self._call_deadline()
            worker.send(request, deadline)
        return worker, deadline

    def _finish_call(self, worker: SandboxWorker, restart: bool) -> None:
        """After a call: the processes it forked are killed; a child that asked to be replaced, or that sent
        more than was asked, is."""
        if restart or not worker.finish_call():
            self._drop_worker()

    def _score_per_sample(self, batch: RewardBatch) -> ComponentResult:
        n = len(batch)
        scores = [0.0] * n
        errors: list[str | None] = [None] * n
        extra: dict[str, list[float]] = {}
        items = [[i, _verl_args(batch, i)] for i in range(n)]
        pending = list(range(n))
        while pending:
            try:
                worker, deadline = self._send_with_one_restart({"op": "samples", "items": [items[i] for i in pending]})
            except WorkerLoadError as exc:
                reason = f"loading {Path(self.path).name} failed: {'; '.join(exc.problems)}"
                for i in pending:
                    errors[i] = reason
                break
            except (WorkerDied, WorkerTimeout) as exc:
                reason = f"timeout after {self.timeout_s:g}s" if isinstance(exc, WorkerTimeout) else str(exc)
                for i in pending:
                    errors[i] = reason
                self._drop_worker()
                break
            # Read one reply per sample, each with its own deadline (the first one's includes the request);
            # the sample in progress is always pending[0] because the child answers in order.
            while pending:
                try:
                    reply = worker.recv(deadline)
                except (WorkerTimeout, WorkerDied) as exc:
                    errors[pending.pop(0)] = (
                        f"timeout after {self.timeout_s:g}s" if isinstance(exc, WorkerTimeout) else str(exc)
                    )
                    self._drop_worker()
                    break  # a fresh child takes the rest
                deadline = self._call_deadline()
                if reply.get("op") != "sample" or reply.get("index") != pending[0]:
                    for i in pending:
                        errors[i] = "unexpected reply from the worker"
                    self._drop_worker()
                    pending = []
                    break
                _record_sample(reply, pending.pop(0), scores, errors, extra)
            else:
                self._finish_samples(worker)
        return ComponentResult(scores, [None if e is None else truncate_reason(e) for e in errors], extra)

    def _finish_samples(self, worker: SandboxWorker) -> None:
        """Read the child's end-of-batch marker (it may ask to be replaced)."""
        try:
            done = worker.recv(time.monotonic() + HARD_KILL_GRACE_S)
        except (WorkerTimeout, WorkerDied):
            self._drop_worker()
            return
        self._finish_call(worker, done.get("op") != "done" or bool(done.get("restart")))


def _record_sample(
    reply: dict, index: int, scores: list[float], errors: list[str | None], extra: dict[str, list[float]]
) -> None:
    """One sample's reply into the batch's scores, errors and extra metrics."""
    if reply.get("ok"):
        try:
            scores[index], sample_extra = _verl_value(reply.get("value"))
        except (TypeError, ValueError) as exc:
            errors[index] = str(exc)
        else:
            for key, value in sample_extra.items():
                extra.setdefault(key, []).append(value)
    else:
        errors[index] = str(reply.get("reason") or "unknown error")


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
    "ReplyRefused",
    "SandboxWorker",
    "WorkerDied",
    "WorkerLoadError",
    "WorkerTimeout",
    "PythonFunctionReward",
    "check_reward_file",
    "OPENRLHF_NAME",
    "VERL_NAME",
]
