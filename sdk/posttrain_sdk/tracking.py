"""Tracking a run of another engine (TRL, OpenRLHF, verl, your own loop) as a Posttrain run.

    import posttrain_sdk as posttrain

    run = posttrain.init("gsm8k-grpo", name="qwen-0.5b lr=1e-6", config={"lr": 1e-6}, project="math")
    for step in range(100):
        run.log({"reward/mean": r, "kl/mean": kl}, step=step)
        run.log_samples([{"prompt": p, "response": c, "reward": s}], step=step)
    run.finish()

Local first, like the engine: every call appends an event to `<dir>/<run id>/events.jsonl` and
returns; a background sender (posttrain_sdk.event_sender, the engine's own) ships the file with
retries and resends whatever an outage of the server held back. A heartbeat every `heartbeat_s`
tells the server the client is alive; when heartbeats stop (the process was killed) the server
fails the run as "lost". Events still undelivered when the process ends stay in the folder:
`posttrain sync <dir>` sends them later.

The first argument of `init` is the experiment that groups the runs (made on first use); `project=` is
the Posttrain project it is in. Before projects existed that first argument was called `project`: code
that passed `project="gsm8k-grpo"` by keyword now names a Posttrain project, and is told so.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import sys
import threading
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from posttrain_sdk import rollout_files
from posttrain_sdk.client import Client, ProjectRef
from posttrain_sdk.errors import FieldError, NotFound, PosttrainError
from posttrain_sdk.event_log import EventLog, Heartbeat
from posttrain_sdk.event_sender import DEFAULT_FLUSH_TIMEOUT_S, EventSender

RUN_FILE = "run.json"  # the run's id, server, events URL and ingestion token: what `posttrain sync` needs
DEFAULT_DIR = "posttrain-runs"
DEFAULT_HEARTBEAT_S = 10.0
MAX_METRIC_NAME = 200
_SAMPLE_FIELDS = frozenset(
    {
        "prompt",
        "response",
        "reward",
        "components",
        "advantage",
        "label",
        "group",
        "index",
        "length",
        "finish_reason",
        "kept",
        "turns",
        "env",
        "errors",
    }
)

_current: TrackedRun | None = None


def as_number(value: Any, where: str) -> float | None:
    """A metric value as a float: numbers, numpy and torch scalars (`.item()`), bools; None stays None."""
    if value is None:
        return None
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (TypeError, ValueError):
            raise TypeError(f"{where}: must be a single number, got an array") from None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    raise TypeError(f"{where}: must be a number, got {type(value).__name__}")


def as_text(value: Any) -> str:
    """A prompt or completion as text: chat messages become `role: content` lines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, Mapping) and "content" in m for m in value):
        return "\n".join(f"{m.get('role', 'user')}: {as_text(m['content'])}" for m in value)
    if isinstance(value, list) and all(isinstance(part, Mapping) and "text" in part for part in value):
        return "".join(str(part["text"]) for part in value)  # content parts of a multimodal message
    return "" if value is None else str(value)


def _json_number(value: float | None) -> Any:
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


class TrackedRun:
    """An external run being tracked. Use `init()` to make one."""

    def __init__(
        self,
        *,
        run: dict[str, Any],
        server_url: str,
        events_url: str,
        ingest_token: str,
        run_dir: Path,
        heartbeat_s: float,
        flush_timeout_s: float,
    ):
        self.id: str = run["id"]
        self.name: str = run.get("name") or self.id
        self.server_url = server_url
        self.url = f"{server_url}/runs/{self.id}/"  # the run page
        self.dir = run_dir
        self.flush_timeout_s = flush_timeout_s
        self._events = EventLog(run_dir, self.id)
        self._sender = EventSender(self._events.path, events_url, ingest_token).start()
        self._events.add_listener(self._sender.wake)
        self._heartbeat = Heartbeat(self._events, heartbeat_s).__enter__()
        self._lock = threading.Lock()
        self._next_step = 0
        self._sample_index: dict[int, int] = {}
        self._parts: dict[int, int] = {}  # step -> rollout files written for it (a second call: part 1)
        self.finished = False
        self.delivered: bool | None = None
        self._events.emit("status", {"state": "running"})

    # -- logging ------------------------------------------------------------------------------------

    @property
    def step(self) -> int:
        """The step the next `log()` without a step goes to."""
        return self._next_step

    def _step_for(self, step: int | None) -> int:
        if step is None:
            return self._next_step
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step: must be a non-negative integer, got {step!r}")
        return step

    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """One point per metric at `step` (default: one after the last step logged). Values are numbers
        (numpy and torch scalars too); NaN and inf are kept, None is skipped."""
        self._check_open()
        if not isinstance(metrics, Mapping):
            raise TypeError(f"metrics: must be a mapping of name to number, got {type(metrics).__name__}")
        values: dict[str, Any] = {}
        for name, value in metrics.items():
            if not isinstance(name, str) or not name or len(name) > MAX_METRIC_NAME:
                raise ValueError(f"metrics: names must be strings of 1 to {MAX_METRIC_NAME} characters, got {name!r}")
            number = as_number(value, f"metrics[{name!r}]")
            if number is not None:
                values[name] = _json_number(number)
        with self._lock:
            at = self._step_for(step)
            if values:
                self._events.emit("metrics", values, step=at)
            self._next_step = max(self._next_step, at + 1)
            self._heartbeat.step = at

    def log_samples(self, rows: Iterable[Mapping[str, Any]], step: int | None = None) -> int:
        """Rollouts of a step: each row has `prompt` and `response` (text or chat messages) and may have
        `reward`, `components` ({name: score}), `advantage`, `label`, `group` (same-prompt group),
        `length` (tokens; default: characters), `finish_reason` (stop/length), `kept`, `turns`, `env`,
        `errors`. Written at once as a Parquet file in the run folder's `rollouts/` (one per call), which
        the sender uploads before the `samples` event that names it. Returns how many were logged."""
        self._check_open()
        with self._lock:
            at = self._step_for(step if step is not None else max(self._next_step - 1, 0))
            index = self._sample_index.get(at, 0)
            samples = []
            for i, row in enumerate(rows):
                samples.append(self._sample(row, f"rows[{i}]", index))
                index = samples[-1]["index"] + 1
            if not samples:
                return 0
            self._sample_index[at] = index
            part = self._parts.get(at, 0)
            self._parts[at] = part + 1
            info = rollout_files.write_step(
                self.dir / rollout_files.FOLDER,
                rollout_files.rows_table(samples, at),
                step=at,
                part=part,
                metadata={"run": self.id},
            )
            # The sender uploads the file before it posts this event (posttrain_sdk.event_sender).
            self._events.emit("samples", info.event_data(upload=True), step=at)
            return len(samples)

    def _sample(self, row: Mapping[str, Any], where: str, index: int) -> dict[str, Any]:
        if not isinstance(row, Mapping):
            raise TypeError(f"{where}: must be a mapping, got {type(row).__name__}")
        unknown = sorted(set(row) - _SAMPLE_FIELDS)
        if unknown:
            raise ValueError(
                f"{where}.{unknown[0]}: unknown field; expected some of {', '.join(sorted(_SAMPLE_FIELDS))}"
            )
        for key in ("prompt", "response"):
            if key not in row:
                raise ValueError(f"{where}.{key}: required")
        response = as_text(row["response"])
        components = {}
        for name, value in (row.get("components") or {}).items():
            number = as_number(value, f"{where}.components[{name!r}]")
            components[str(name)] = _json_number(number)
        reward = as_number(row.get("reward"), f"{where}.reward")
        advantage = as_number(row.get("advantage"), f"{where}.advantage")
        label = row.get("label")
        sample = {
            "index": int(row.get("index", index)),
            "group": int(row.get("group", 0)),
            "prompt": as_text(row["prompt"]),
            "response": response,
            "label": None if label is None else (label if isinstance(label, (str, int, float)) else as_text(label)),
            "reward": _json_number(reward),
            "components": components,
            "advantage": _json_number(advantage),
            "length": int(row["length"]) if row.get("length") is not None else len(response),
            "finish_reason": str(row.get("finish_reason") or "stop"),
            "kept": bool(row.get("kept", True)),
            "errors": [str(e) for e in row.get("errors") or []],
        }
        if row.get("turns"):
            sample["turns"] = list(row["turns"])
        if row.get("env"):
            sample["env"] = {str(k): _json_number(as_number(v, f"{where}.env[{k!r}]")) for k, v in row["env"].items()}
        return sample

    def log_text(self, message: str, level: str = "info", step: int | None = None) -> None:
        """A line for the run page's log panel."""
        self._check_open()
        self._events.emit("log", {"level": level, "message": str(message)}, step=step)

    def log_checkpoint(self, path: str | Path, step: int) -> None:
        self._check_open()
        self._events.emit("checkpoint", {"path": str(path)}, step=self._step_for(step))

    # -- the end --------------------------------------------------------------------------------------

    def finish(self, state: str = "succeeded", reason: str | None = None, timeout_s: float | None = None) -> bool:
        """End the run (`succeeded` or `failed`, with a reason); waits up to `timeout_s` (default
        POSTTRAIN_EVENTS_FLUSH_TIMEOUT_S, 120) for the server to acknowledge every event. True when
        everything was delivered; otherwise the events stay in `dir` for `posttrain sync`."""
        global _current
        if state not in ("succeeded", "failed"):
            raise ValueError(f"state: must be 'succeeded' or 'failed', got {state!r}")
        with self._lock:
            if self.finished:
                return bool(self.delivered)
            self.finished = True
        self._heartbeat.__exit__(None, None, None)
        self._events.emit("status", {"state": state, "reason": (reason or "finished by its client")[:2000]})
        self._events.close()
        self.delivered = self._sender.finish(self.flush_timeout_s if timeout_s is None else timeout_s)
        if _current is self:
            _current = None
        return self.delivered

    def _check_open(self) -> None:
        if self.finished:
            raise PosttrainError(f"run {self.id} is finished; start a new one with posttrain.init()")

    def __enter__(self) -> TrackedRun:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None:
            self.finish()
        else:
            self.finish("failed", "interrupted" if kind is KeyboardInterrupt else f"{type(exc).__name__}: {exc}")


def init(
    experiment: str | None = None,
    name: str | None = None,
    config: Mapping[str, Any] | None = None,
    *,
    project: ProjectRef | None = None,
    engine: str = "python",
    tags: list[str] | None = None,
    note: str = "",
    total_steps: int | None = None,
    dir: str | Path | None = None,
    url: str | None = None,
    token: str | None = None,
    heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    flush_timeout_s: float | None = None,
) -> TrackedRun:
    """Register an external run in `experiment` (an experiment without a model, made on first use) and start
    tracking it.

    `project` is the Posttrain project (a name or id) the experiment is in; default POSTTRAIN_PROJECT, else the
    server's default from `posttrain projects use`, else the one project you can create in. (It used to be the
    name of the first argument: `init(project="x")` now fails, asking for the experiment.)
    `config` is stored as the run's config (compare shows the fields that differ between runs);
    `engine` names what trains (trl, openrlhf, verl, ...); `total_steps` draws the progress bar.
    The run finishes as succeeded when the process exits normally, failed on an uncaught exception."""
    global _current
    if not experiment:
        raise PosttrainError(
            "experiment: required: init's first argument names the experiment that groups the runs; "
            "project= names the Posttrain project it is in"
        )
    client = Client(url, token, project=project)
    try:
        body = {
            "experiment": experiment,
            "name": name or "",
            "config": _jsonable(dict(config or {})),
            "engine": engine,
            "tags": tags or [],
            "note": note,
            "total_steps": total_steps,
            **client.creating_in(None),
        }
        answer = _register(client, body)
    finally:
        client.close()
    run_dir = Path(dir or os.environ.get("POSTTRAIN_DIR") or DEFAULT_DIR) / answer["run"]["id"]
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_run_file(run_dir, answer, client.url)
    if flush_timeout_s is None:
        flush_timeout_s = float(os.environ.get("POSTTRAIN_EVENTS_FLUSH_TIMEOUT_S", DEFAULT_FLUSH_TIMEOUT_S))
    run = TrackedRun(
        run=answer["run"],
        server_url=client.url,
        events_url=answer["events_url"],
        ingest_token=answer["ingest_token"],
        run_dir=run_dir,
        heartbeat_s=heartbeat_s,
        flush_timeout_s=flush_timeout_s,
    )
    _current = run
    _finish_at_exit(run)
    return run


def _register(client: Client, body: dict[str, Any]) -> dict[str, Any]:
    """`POST /api/runs/external/`; a project that does not exist gets a word on what `project` means now."""
    try:
        return client.post("/api/runs/external/", body)
    except NotFound as missing:
        if "project" not in missing.fields:
            raise
        hint = (
            f"{missing.fields['project']} (project= names a Posttrain project; the experiment that groups the runs "
            "is init's first argument)"
        )
        raise NotFound(missing.status, [FieldError("project", hint)], body=missing.body) from None


def _write_run_file(run_dir: Path, answer: dict[str, Any], server_url: str) -> None:
    record = {
        "id": answer["run"]["id"],
        "name": answer["run"].get("name"),
        "server": server_url,
        "events_url": answer["events_url"],
        "ingest_token": answer["ingest_token"],
    }
    fd = os.open(run_dir / RUN_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)


def _jsonable(value: Any) -> Any:
    """A config as JSON: dataclasses and objects with `to_dict()` (TrainingArguments) as dicts,
    paths and other objects as strings."""
    if hasattr(value, "to_dict") and callable(value.to_dict):
        value = value.to_dict()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


_at_exit: weakref.WeakSet[TrackedRun] = weakref.WeakSet()
_previous_excepthook = sys.excepthook


def _finish_at_exit(run: TrackedRun) -> None:
    if not _at_exit:
        atexit.register(_finish_open_runs)
        sys.excepthook = _fail_open_runs
    _at_exit.add(run)


def _finish_open_runs() -> None:
    for run in list(_at_exit):
        if not run.finished:
            run.finish(reason="its client's process exited")


def _fail_open_runs(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    for run in list(_at_exit):
        if not run.finished:
            reason = "interrupted" if kind is KeyboardInterrupt else f"{kind.__name__}: {exc}"
            run.finish("failed", reason)
    _previous_excepthook(kind, exc, tb)


def current() -> TrackedRun:
    if _current is None:
        raise PosttrainError("no run: call posttrain.init() first")
    return _current


def log(metrics: Mapping[str, Any], step: int | None = None) -> None:
    current().log(metrics, step)


def log_samples(rows: Iterable[Mapping[str, Any]], step: int | None = None) -> int:
    return current().log_samples(rows, step)


def finish(state: str = "succeeded", reason: str | None = None) -> bool:
    return current().finish(state, reason)


def sync(run_dir: str | Path, timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S) -> tuple[int, bool]:
    """Send a run folder's undelivered events (after an outage outlived the process). Returns
    (the last seq the server holds, whether everything was delivered)."""
    run_dir = Path(run_dir)
    try:
        record = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PosttrainError(f"{run_dir}: no {RUN_FILE} here; give the folder of one tracked run") from None
    sender = EventSender(run_dir / "events.jsonl", record["events_url"], record["ingest_token"]).start()
    delivered = sender.flush(timeout_s)
    sender.close()
    if sender.error:
        raise PosttrainError(f"the server refused the events of {run_dir}: {sender.error}")
    return sender.acknowledged_seq, delivered
