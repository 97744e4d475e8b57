"""A run's event log: `{run, seq, type, step, time, data}` lines, append-only, `seq` increasing.

Every event is written to the run folder's `events.jsonl` first (the durable record), by the engine
and by a tracked external run alike; the sender (posttrain_sdk.event_sender) tails that file and
resends from the last acknowledged `seq`, so nothing is lost and nothing is counted twice.
Standard library only.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

EventType = Literal["metrics", "samples", "checkpoint", "log", "status", "heartbeat"]
EVENT_TYPES: frozenset[str] = frozenset({"metrics", "samples", "checkpoint", "log", "status", "heartbeat"})
EVENTS_FILE = "events.jsonl"

Listener = Callable[[dict[str, Any]], None]


def _json_safe(value: Any) -> Any:
    """NaN/Inf are not JSON; a diverged loss must still be recorded, so they become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def read_events(path: Path) -> list[dict[str, Any]]:
    """All complete events of a file. A torn last line (a crash or a full disk cut the write short) is
    ignored: the file is read as bytes and only whole lines are decoded, since the cut may fall inside a
    multi-byte character, which a text-mode read would refuse before the line's end was ever checked."""
    events: list[dict[str, Any]] = []
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return events
    with f:
        for number, line in enumerate(f, start=1):
            if not line.endswith(b"\n"):
                break
            if line.strip():
                events.append(_parse_line(line, path, number))
    return events


def _parse_line(line: bytes, path: Path, number: int) -> dict[str, Any]:
    try:
        return json.loads(line.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError alike: a whole line that is no event
        raise ValueError(f"{path}: line {number} is not an event: {exc}") from None


def _last_seq(path: Path) -> int:
    last = 0
    for event in read_events(path):
        last = max(last, int(event["seq"]))
    return last


class EventLog:
    """Appends events to `<run_dir>/events.jsonl`; thread-safe (the heartbeat runs in a thread).

    Reopening an existing file (a resumed run) continues after its last `seq`, after cutting a torn
    last line left by a crash.
    """

    def __init__(self, run_dir: Path, run_id: str):
        self.run_id = run_id
        self.path = Path(run_dir) / EVENTS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._truncate_torn_tail()
        self._seq = _last_seq(self.path)
        self._file = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []

    def _truncate_torn_tail(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            self.path.write_bytes(data[: data.rfind(b"\n") + 1])

    @property
    def last_seq(self) -> int:
        return self._seq

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def emit(self, type: EventType, data: dict[str, Any], step: int | None = None) -> dict[str, Any]:
        if type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {type!r}; expected one of {sorted(EVENT_TYPES)}")
        with self._lock:
            self._seq += 1
            event = {
                "run": self.run_id,
                "seq": self._seq,
                "type": type,
                "step": step,
                "time": time.time(),
                "data": _json_safe(data),
            }
            self._file.write(json.dumps(event, ensure_ascii=False, allow_nan=False) + "\n")
            self._file.flush()
        for listener in self._listeners:
            listener(event)
        return event

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()


class Heartbeat:
    """Emits a `heartbeat` event every `interval_s` until stopped, so the platform can tell a live run
    from a lost one. `step` reports the last step the loop announced."""

    def __init__(self, log: EventLog, interval_s: float):
        self._log = log
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self.step = 0

    def __enter__(self) -> Heartbeat:
        if self._interval_s > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._log.emit("heartbeat", {}, step=self.step)
