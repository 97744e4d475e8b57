"""Child side of the python reward sandbox (see ``python_fn.py`` for the parent side).

The parent runs this file by path (``runpy.run_path``) with ``READ_FD WRITE_FD`` arguments. It
imports only the standard library and nothing from rl_engine, so torch is loaded only if the
user's file imports it. Messages are JSON in frames over two pipes (a 4-byte big-endian length,
then that many bytes: ``read_frame``/``write_frame``); stdout/stderr stay free for the user's
prints. JSON (not pickle, and ASCII: ``json.dumps``' default) on the way back means the parent
never unpickles anything the user code could have forged, and reads every reply under a deadline
with a size cap (``rl_engine/rewards/sandbox_worker.py``).

Reward functions; or, when the first message has ``"kind": "environment"``, a multi-turn
environment class (``rl_engine/environments``), one instance per episode.

Protocol (parent -> child):
    {"op": "batch", "kwargs": {...}}          call the OpenRLHF-shaped function once
    {"op": "samples", "items": [[i, {...}]]}  call the verl-shaped function per sample
    {"op": "close"}
Child -> parent:
    {"op": "ready", "function": name, "batch": bool} | {"op": "load_error", "problems": [...]}
    {"op": "result", "value": ..., "restart": bool} | {"op": "error", "reason": ..., "restart": bool}
    {"op": "sample", "index": i, "ok": bool, "value"/"reason": ...} ... {"op": "done", "restart": bool}
Environments (parent -> child; each answered by one "sample" reply per item, then "done"):
    {"op": "reset", "items": [[episode, {"prompt", "label", "metadata"}]]}  value: {"observation", "next_turn_trained"}
    {"op": "step", "items": [[episode, action_text]]}   value: {"observation", "reward", "done", "logs",
                                                                "next_turn_trained"}
    {"op": "end", "items": [[episode, null]]}          drops the episodes (their close(), if they have one)

``restart`` asks the parent to replace this process after the reply (after a MemoryError the
interpreter may be in a poor state; past half of its CPU-time limit).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import os
import resource
import signal
import struct
import sys
import traceback
from collections.abc import Callable
from typing import Any

MODULE_NAME = "_posttrain_user_reward"
OPENRLHF_NAME = "reward_func"
VERL_NAME = "compute_score"
VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
FRAME_HEADER = struct.Struct(">I")  # a frame: its length, then its bytes
MAX_REASON_CHARS = 1000  # an error message, as sent back (the parent caps the size of every reply)


class CallTimeout(BaseException):
    """Raised by SIGALRM inside user code; BaseException so a bare ``except Exception`` in the
    user's function cannot swallow it."""


# --- loading ---------------------------------------------------------------------------------


class LoadedFunction:
    def __init__(self, fn: Callable, name: str, batch: bool, call_style: str, extra_kwargs: Any):
        self.fn = fn
        self.name = name
        self.batch = batch
        self.call_style = call_style  # verl: "kw4" | "kw3" | "pos4" | "pos3"; OpenRLHF: "pos3"
        self.extra_kwargs = extra_kwargs  # OpenRLHF: "all" or the set of extra names it accepts


def syntax_problem(exc: SyntaxError) -> str:
    return f"syntax error at line {exc.lineno}: {exc.msg}"


def describe_exception(exc: BaseException, path: str) -> str:
    """``"ZeroDivisionError: division by zero (line 7)"``: the line is the last one in the
    user's file on the traceback, i.e. where their code raised or called into the failure."""
    if isinstance(exc, SyntaxError) and exc.filename == path:
        return syntax_problem(exc)
    message = str(exc)
    if len(message) > MAX_REASON_CHARS:
        message = message[:MAX_REASON_CHARS] + "…"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == path:
            line = lineno
    return f"{text} (line {line})" if line is not None else text


def import_user_file(path: str) -> tuple[Any, list[str]]:
    """The user's file as a module, or (None, problems)."""
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.insert(0, directory)  # like running the file as a script: siblings import
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        return None, [f"cannot import {path} as a Python file"]
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        return None, [syntax_problem(exc) if exc.filename == path else describe_exception(exc, path)]
    except BaseException as exc:  # anything at import time, SystemExit included
        return None, [f"importing the file failed: {describe_exception(exc, path)}"]
    return module, []


def load_function(path: str, function: str | None, batch: bool | None) -> tuple[LoadedFunction | None, list[str]]:
    """Import the user's file and decide how to call its function; returns (loaded, problems)."""
    module, problems = import_user_file(path)
    if module is None:
        return None, problems
    if function:
        name = function
        if not hasattr(module, name):
            return None, [f"no function named {name!r} in the file"]
    else:
        name = next((n for n in (OPENRLHF_NAME, VERL_NAME) if hasattr(module, n)), "")
        if not name:
            return None, [
                f"the file defines neither {OPENRLHF_NAME}(queries, prompts, labels, **kwargs) (OpenRLHF) "
                f"nor {VERL_NAME}(data_source, solution_str, ground_truth, extra_info=None) (verl)"
            ]
    fn = getattr(module, name)
    if not callable(fn):
        return None, [f"{name!r} is not a function"]
    try:
        signature: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None  # some builtins and C callables: trust the configured shape

    if batch is None:
        batch = _guess_batch(name, signature)
        if batch is None:
            return None, [
                f"cannot tell whether {name}{signature} is batched (OpenRLHF: queries, prompts, labels) "
                f"or per-sample (verl: data_source, solution_str, ground_truth); set batch"
            ]
    if batch:
        return _openrlhf_call(fn, name, signature)
    return _verl_call(fn, name, signature)


def _guess_batch(name: str, signature: inspect.Signature | None) -> bool | None:
    if name == OPENRLHF_NAME:
        return True
    if name == VERL_NAME:
        return False
    params = set(signature.parameters) if signature else set()
    if "queries" in params:
        return True
    if "solution_str" in params:
        return False
    return None


def _openrlhf_call(
    fn: Callable, name: str, signature: inspect.Signature | None
) -> tuple[LoadedFunction | None, list[str]]:
    if signature is None:
        return LoadedFunction(fn, name, True, "pos3", set()), []
    try:
        bound = signature.bind([], [], [])
    except TypeError:
        return None, [
            f"{name}{signature} cannot be called as {name}(queries, prompts, labels, **kwargs) (OpenRLHF shape)"
        ]
    params = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        extra: Any = "all"
    else:
        keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        extra = {p.name for p in params if p.kind in keyword_kinds and p.name not in bound.arguments}
    return LoadedFunction(fn, name, True, "pos3", extra), []


def _verl_call(fn: Callable, name: str, signature: inspect.Signature | None) -> tuple[LoadedFunction | None, list[str]]:
    if signature is None:
        return LoadedFunction(fn, name, False, "kw4", None), []
    # verl calls with keywords; accept functions without extra_info, or with other names.
    attempts: tuple[tuple[str, tuple[None, ...], dict[str, None]], ...] = (
        ("kw4", (), dict.fromkeys(VERL_ARGS)),
        ("kw3", (), dict.fromkeys(VERL_ARGS[:3])),
        ("pos4", (None,) * 4, {}),
        ("pos3", (None,) * 3, {}),
    )
    for style, args, kwargs in attempts:
        try:
            signature.bind(*args, **kwargs)
        except TypeError:
            continue
        return LoadedFunction(fn, name, False, style, None), []
    return None, [
        f"{name}{signature} cannot be called as {name}(data_source, solution_str, ground_truth, extra_info=None) (verl shape)"
    ]


# --- calling ---------------------------------------------------------------------------------


def to_plain(value: Any) -> Any:
    """JSON-able copy of a return value; tensors and arrays via ``tolist``/``item`` (no imports)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if hasattr(value, "tolist"):
        return to_plain(value.tolist())
    if hasattr(value, "item"):
        return to_plain(value.item())
    raise TypeError(f"returned an unsupported type {type(value).__name__}")


def _on_alarm(signum: int, frame: Any) -> None:
    raise CallTimeout()


def timed_call(fn: Callable[[], Any], timeout_s: float) -> Any:
    """Run ``fn`` under a SIGALRM deadline. Pure-Python loops and sleeps are interrupted;
    code stuck inside C without checking signals is left to the parent's hard kill."""
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return to_plain(fn())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


class Runner:
    def __init__(self, loaded: LoadedFunction, path: str, timeout_s: float):
        self.loaded = loaded
        self.path = path
        self.timeout_s = timeout_s

    def _failure(self, exc: BaseException) -> tuple[str, bool]:
        """(reason, restart?) for an exception raised while calling user code."""
        if isinstance(exc, CallTimeout):
            return f"timeout after {self.timeout_s:g}s", False
        return describe_exception(exc, self.path), isinstance(exc, MemoryError)

    def run_batch(self, kwargs: dict) -> dict:
        loaded = self.loaded
        args = (kwargs.pop("queries"), kwargs.pop("prompts"), kwargs.pop("labels"))
        if loaded.extra_kwargs != "all":
            kwargs = {k: v for k, v in kwargs.items() if k in loaded.extra_kwargs}
        try:
            value = timed_call(lambda: loaded.fn(*args, **kwargs), self.timeout_s)
        except BaseException as exc:
            reason, restart = self._failure(exc)
            return {"op": "error", "reason": reason, "restart": restart}
        return {"op": "result", "value": value, "restart": False}

    def run_sample(self, item: dict) -> tuple[dict, bool]:
        loaded = self.loaded
        values = [item.get(k) for k in VERL_ARGS]
        style = loaded.call_style
        if style == "kw4":
            call = lambda: loaded.fn(**dict(zip(VERL_ARGS, values)))  # noqa: E731
        elif style == "kw3":
            call = lambda: loaded.fn(**dict(zip(VERL_ARGS[:3], values[:3])))  # noqa: E731
        elif style == "pos4":
            call = lambda: loaded.fn(*values)  # noqa: E731
        else:
            call = lambda: loaded.fn(*values[:3])  # noqa: E731
        try:
            return {"ok": True, "value": timed_call(call, self.timeout_s)}, False
        except BaseException as exc:
            reason, restart = self._failure(exc)
            return {"ok": False, "reason": reason}, restart


# --- environments ------------------------------------------------------------------------------


def load_environment(path: str, name: str) -> tuple[Any, list[str]]:
    module, problems = import_user_file(path)
    if module is None:
        return None, problems
    cls = getattr(module, name, None)
    if cls is None:
        return None, [f"no class named {name!r} in the file"]
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing:
        return None, [
            f"{name} has no {' or '.join(missing)} method (reset(prompt, label, metadata) -> observation; "
            "step(action) -> (observation, reward, done[, logs]))"
        ]
    return cls, []


def step_result(value: Any) -> dict:
    """A step's return value as {"observation", "reward", "done", "logs", "next_turn_trained"}; ValueError names
    what is wrong."""
    next_turn_trained = True
    if isinstance(value, dict):
        observation, reward, done, logs = (
            value.get("observation"),
            value.get("reward", 0.0),
            value.get("done"),
            value.get("logs") or {},
        )
        next_turn_trained = value.get("next_turn_trained", True)
    elif isinstance(value, (tuple, list)) and len(value) in (3, 4):
        observation, reward, done = value[:3]
        logs = value[3] if len(value) == 4 else {}
    else:
        raise ValueError(
            f"step() must return (observation, reward, done[, logs]) or a dict with those keys, "
            f"got {type(value).__name__}"
        )
    if observation is not None and not isinstance(observation, str):
        raise ValueError(f"step()'s observation must be a string or None, got {type(observation).__name__}")
    if not isinstance(done, bool):
        raise ValueError(f"step()'s done must be True or False, got {done!r}")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise ValueError(f"step()'s reward must be a number, got {reward!r}")
    if not isinstance(logs, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in logs.values()
    ):
        raise ValueError("step()'s logs must be a dict of numbers")
    if not isinstance(next_turn_trained, bool):
        raise ValueError(f"step()'s next_turn_trained must be True or False, got {next_turn_trained!r}")
    return {
        "observation": observation,
        "reward": float(reward),
        "done": done,
        "logs": {str(k): float(v) for k, v in logs.items()},
        "next_turn_trained": next_turn_trained,
    }


def reset_result(value: Any) -> dict:
    """A reset's return value (an observation, None, or a dict with `observation` and `next_turn_trained`) as
    {"observation", "next_turn_trained"}; ValueError names what is wrong."""
    observation, next_turn_trained = value, True
    if isinstance(value, dict):
        observation, next_turn_trained = value.get("observation"), value.get("next_turn_trained", True)
    if observation is not None and not isinstance(observation, str):
        raise ValueError(f"reset() must return a string or None, got {type(observation).__name__}")
    if not isinstance(next_turn_trained, bool):
        raise ValueError(f"reset()'s next_turn_trained must be True or False, got {next_turn_trained!r}")
    return {"observation": observation, "next_turn_trained": next_turn_trained}


class EnvironmentRunner:
    def __init__(self, cls: Any, path: str, options: dict, timeout_s: float):
        self.cls, self.path, self.options, self.timeout_s = cls, path, options, timeout_s
        self.episodes: dict[Any, Any] = {}

    def run(self, op: str, episode: Any, payload: Any) -> tuple[dict, bool]:
        try:
            if op == "end":
                self.drop(episode)
                return {"ok": True, "value": None}, False
            if op == "reset":

                def reset() -> Any:
                    env = self.cls(**self.options)
                    self.episodes[episode] = env
                    return env.reset(payload.get("prompt"), payload.get("label"), payload.get("metadata") or {})

                return {"ok": True, "value": reset_result(timed_call(reset, self.timeout_s))}, False
            env = self.episodes[episode]
            return {"ok": True, "value": step_result(timed_call(lambda: env.step(payload), self.timeout_s))}, False
        except BaseException as exc:
            self.drop(episode)
            if isinstance(exc, CallTimeout):
                return {"ok": False, "reason": f"{op}() timed out after {self.timeout_s:g}s"}, False
            return {"ok": False, "reason": f"{op}(): {describe_exception(exc, self.path)}"}, isinstance(
                exc, MemoryError
            )

    def drop(self, episode: Any) -> None:
        """The episode is over: its instance's `close()`, if it has one, lets go of what it holds (best effort:
        the episode's result is already decided)."""
        env = self.episodes.pop(episode, None)
        close = getattr(env, "close", None)
        if callable(close):
            with contextlib.suppress(BaseException):  # nothing is owed to a dropped episode
                timed_call(close, self.timeout_s)


def _serve_environment(config: dict, inbox: int, outbox: int) -> int:
    path = config["path"]
    try:
        cls, problems = load_environment(path, config["class"])
    except MemoryError:
        cls, problems = None, ["importing the file failed: MemoryError"]
    if cls is None:
        _send(outbox, {"op": "load_error", "problems": problems})
        return 0
    _send(outbox, {"op": "ready", "function": config["class"], "batch": False})
    runner = EnvironmentRunner(cls, path, config.get("options") or {}, float(config["timeout_s"]))
    while True:
        request = _receive(inbox)
        if request is None or request.get("op") == "close":  # None: the parent went away
            return 0
        op = str(request.get("op"))
        restart = False
        for episode, payload in request.get("items", []):
            reply, needs_restart = runner.run(op, episode, payload)
            restart = restart or needs_restart
            _send(outbox, {"op": "sample", "index": episode, **reply})
        # Open episodes live in this process: replace it for its CPU time only between episodes.
        _send(outbox, {"op": "done", "restart": restart or (not runner.episodes and cpu_budget_spent())})


def read_frame(fd: int) -> bytes | None:
    """The next frame from the parent, or None when the parent went away."""
    header = _read_exactly(fd, FRAME_HEADER.size)
    if header is None:
        return None
    return _read_exactly(fd, FRAME_HEADER.unpack(header)[0])


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        try:
            chunk = os.read(fd, min(left, 1 << 20))
        except InterruptedError:
            continue
        except OSError:
            return None
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def write_frame(fd: int, data: bytes) -> None:
    view = memoryview(FRAME_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _receive(inbox: int) -> dict | None:
    frame = read_frame(inbox)
    return None if frame is None else json.loads(frame)


def _send(outbox: int, message: dict) -> None:
    # Values went through to_plain already; str() is only a last resort for odd exception args.
    write_frame(outbox, json.dumps(message, default=str).encode())


def _limit_memory(memory_mb: float) -> None:
    """Cap the address space (RLIMIT_AS): a runaway allocation raises MemoryError here instead
    of pushing the trainer's node into the OOM killer."""
    limit = int(memory_mb * 1024 * 1024)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash must not write a core dump


def cpu_budget_spent() -> bool:
    """Half of this process's CPU-time limit used: the parent replaces it before the limit kills it
    in the middle of a call (a long run adds up CPU time in one long-lived child)."""
    limit, _ = resource.getrlimit(resource.RLIMIT_CPU)
    if limit == resource.RLIM_INFINITY:
        return False
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime > limit / 2


def main(argv: list[str]) -> int:
    inbox, outbox = int(argv[0]), int(argv[1])
    config = _receive(inbox)
    if config is None:
        return 0
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns our lifetime
    _limit_memory(config["memory_mb"])
    if config.get("kind") == "environment":
        return _serve_environment(config, inbox, outbox)
    path = config["path"]
    try:
        loaded, problems = load_function(path, config.get("function"), config.get("batch"))
    except MemoryError:
        loaded, problems = None, ["importing the file failed: MemoryError"]
    if loaded is None:
        _send(outbox, {"op": "load_error", "problems": problems})
        return 0
    _send(outbox, {"op": "ready", "function": loaded.name, "batch": loaded.batch})
    runner = Runner(loaded, path, float(config["timeout_s"]))

    while True:
        request = _receive(inbox)
        if request is None or request.get("op") == "close":  # None: the parent went away
            return 0
        op = request.get("op")
        if op == "batch":
            reply = runner.run_batch(request["kwargs"])
            _send(outbox, {**reply, "restart": reply["restart"] or cpu_budget_spent()})
        elif op == "samples":
            restart = False
            for index, item in request["items"]:
                reply, needs_restart = runner.run_sample(item)
                restart = restart or needs_restart
                _send(outbox, {"op": "sample", "index": index, **reply})
            _send(outbox, {"op": "done", "restart": restart or cpu_budget_spent()})
        else:
            _send(outbox, {"op": "error", "reason": f"unknown request {op!r}", "restart": False})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
