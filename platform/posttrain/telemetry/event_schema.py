"""Validation of an event batch posted by the engine (docs/ARCHITECTURE.md, "Events").

`parse_batch` turns the request body into clean events or raises InvalidInput whose errors name the
exact field (`events[3].seq`, `events[0].data.samples[5].reward`). The checks are what the store
needs to never fail later: a batch that passes here inserts without a database error.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, TypeGuard

from posttrain.core.errors import InvalidInput
from posttrain_sdk.event_log import EVENT_TYPES
from posttrain_sdk.rollout_files import parse_file_name

MAX_EVENTS_PER_BATCH = 10_000
ENGINE_STATES = ("running", "succeeded", "failed", "preempted")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_MAX_ERRORS = 20  # per batch: enough to fix a broken sender, short enough to read
MAX_INT32 = 2**31 - 1  # steps, sample indexes and lengths are 32-bit columns
MAX_INT64 = 2**63 - 1  # seq is a 64-bit column


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_numberish(v: Any) -> bool:
    """A number, null, or one of the engine's strings for non-finite floats."""
    return _is_number(v) or v is None or (isinstance(v, str) and v in _NON_FINITE)


def _strip_nul(value: Any) -> Any:
    """Postgres text and jsonb cannot hold NUL characters; model output and user reward errors can."""
    if isinstance(value, str):
        return value.replace("\x00", "") if "\x00" in value else value
    if isinstance(value, dict):
        return {_strip_nul(k): _strip_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip_nul(v) for v in value]
    return value


def finite_or_none(value: Any) -> float | None:
    """A float for storage: numbers as they are, the engine's "nan"/"inf" strings and None as None."""
    if _is_number(value) and math.isfinite(value):
        return float(value)
    return None


class _Errors:
    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []

    def add(self, loc: str, msg: str) -> None:
        if len(self.items) < _MAX_ERRORS:
            self.items.append({"loc": loc, "msg": msg})


def parse_batch(body: Any, run_id: str) -> list[dict[str, Any]]:
    """The events of a request body `{"events": [...]}`, validated and sorted as sent."""
    if not isinstance(body, dict):
        raise InvalidInput.one("", f'the body must be a JSON object {{"events": [...]}}, got {type(body).__name__}')
    if "events" not in body:
        raise InvalidInput.one("events", "required: a list of events")
    events = body["events"]
    if not isinstance(events, list):
        raise InvalidInput.one("events", f"must be a list, got {type(events).__name__}")
    if len(events) > MAX_EVENTS_PER_BATCH:
        raise InvalidInput.one("events", f"at most {MAX_EVENTS_PER_BATCH} events per batch, got {len(events)}")
    errors = _Errors()
    for i, event in enumerate(events):
        _check_event(event, f"events[{i}]", run_id, errors)
    if errors.items:
        raise InvalidInput(errors.items)
    return [_strip_nul(e) for e in events]


def _check_event(event: Any, loc: str, run_id: str, errors: _Errors) -> None:
    if not isinstance(event, dict):
        errors.add(loc, f"must be an object, got {type(event).__name__}")
        return
    _check_envelope(event, loc, run_id, errors)
    kind = event.get("type")
    data = event.get("data")
    if "data" in event and not isinstance(data, dict):
        errors.add(f"{loc}.data", f"must be an object, got {type(data).__name__}")
        return
    if kind in EVENT_TYPES and isinstance(data, dict):
        _DATA_CHECKS[kind](event, data, f"{loc}.data", loc, errors)


def _check_envelope(event: dict, loc: str, run_id: str, errors: _Errors) -> None:
    """The fields every event has, whatever its type: run, seq, type, step and time."""
    for key in ("run", "seq", "type", "time", "data"):
        if key not in event:
            errors.add(f"{loc}.{key}", "required")
    if "run" in event and str(event["run"]) != run_id:
        errors.add(f"{loc}.run", f"belongs to run {str(event['run'])[:64]!r}, not to this run ({run_id})")
    seq = event.get("seq")
    if "seq" in event and (not _is_int(seq) or not 1 <= seq <= MAX_INT64):
        errors.add(f"{loc}.seq", f"must be an integer between 1 and {MAX_INT64}, got {seq!r}"[:200])
    kind = event.get("type")
    if "type" in event and kind not in EVENT_TYPES:
        errors.add(
            f"{loc}.type", f"unknown event type {kind!r}; expected one of {', '.join(sorted(EVENT_TYPES))}"[:300]
        )
    step = event.get("step")
    if step is not None and (not _is_int(step) or not 0 <= step <= MAX_INT32):
        errors.add(f"{loc}.step", f"must be null or an integer between 0 and {MAX_INT32}, got {step!r}"[:200])
    if "time" in event and not (_is_number(event["time"]) and math.isfinite(event["time"])):
        errors.add(f"{loc}.time", "must be a finite number (seconds since the epoch)")


def _check_metrics(event: dict, data: dict, loc: str, event_loc: str, errors: _Errors) -> None:
    if not _is_int(event.get("step")):
        errors.add(f"{event_loc}.step", "a metrics event needs its step")
    for name, value in data.items():
        if len(name) > 200:
            errors.add(f"{loc}.{name[:40]}…", "metric names are at most 200 characters")
        elif not _is_numberish(value):
            errors.add(f"{loc}.{name}", f'must be a number (or "nan"/"inf"), got {type(value).__name__}')


def _check_samples(event: dict, data: dict, loc: str, event_loc: str, errors: _Errors) -> None:
    """A step's rollouts are a Parquet file in the run's rollout folder (posttrain_sdk.rollout_files): the
    event names it and carries its statistics, never the rows."""
    step = event.get("step")
    if not _is_int(step):
        errors.add(f"{event_loc}.step", "a samples event needs its step")
    if "samples" in data:
        errors.add(
            f"{loc}.samples",
            "rollouts are no longer sent in events: write them as a rollout file and send its reference "
            "(posttrain_sdk.rollout_files; the SDK's log_samples does both)",
        )
        return
    _check_sample_file(data, step, loc, errors)
    _check_sample_contents(data, loc, errors)


def _check_sample_file(data: dict, step: Any, loc: str, errors: _Errors) -> None:
    """The rollout file's name and part agree with each other and with the event's step."""
    name = data.get("file")
    parsed = parse_file_name(name) if isinstance(name, str) else None
    if parsed is None:
        errors.add(f"{loc}.file", "required: the rollout file's name, step_<8-digit step>[.<part>].parquet")
    elif _is_int(step) and parsed[0] != step:
        errors.add(f"{loc}.file", f"names step {parsed[0]}, but the event is for step {step}")
    part = data.get("part", 0)
    if not _is_int(part) or (parsed is not None and part != parsed[1]):
        errors.add(f"{loc}.part", "must be the part number in the file's name (0 without one)")


def _check_sample_contents(data: dict, loc: str, errors: _Errors) -> None:
    """What the event says of the file: its rows, bytes, SHA-256, statistics and the files it pruned."""
    for key in ("rows", "bytes"):
        value = data.get(key)
        if not _is_int(value) or not 0 <= value <= MAX_INT64:
            errors.add(f"{loc}.{key}", "required: a non-negative integer")
    if data.get("rows", 0) > MAX_INT32:
        errors.add(f"{loc}.rows", f"at most {MAX_INT32}")
    sha = data.get("sha256", "")
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{0,64}", sha):
        errors.add(f"{loc}.sha256", "must be the file's SHA-256 in lowercase hex")
    stats = data.get("stats", {})
    if not isinstance(stats, dict) or len(json.dumps(stats, default=str)) > MAX_STATS_CHARS:
        errors.add(f"{loc}.stats", f"must be an object of at most {MAX_STATS_CHARS} characters as JSON")
    pruned = data.get("pruned", [])
    if not isinstance(pruned, list) or not all(isinstance(p, str) and parse_file_name(p) for p in pruned):
        errors.add(f"{loc}.pruned", "must be a list of rollout file names")


MAX_STATS_CHARS = 2000


def _check_checkpoint(event: dict, data: dict, loc: str, event_loc: str, errors: _Errors) -> None:
    if not _is_int(event.get("step")):
        errors.add(f"{event_loc}.step", "a checkpoint event needs its step")
    path = data.get("path")
    if not isinstance(path, str) or not path or len(path) > 1000:
        errors.add(f"{loc}.path", "required: the checkpoint folder (a string of at most 1000 characters)")


def _check_log(event: dict, data: dict, loc: str, event_loc: str, errors: _Errors) -> None:
    if not isinstance(data.get("message"), str):
        errors.add(f"{loc}.message", "required: a string")
    level = data.get("level", "info")
    if not isinstance(level, str) or len(level) > 20:
        errors.add(f"{loc}.level", "must be a short string such as info, warning or error")


def _check_status(event: dict, data: dict, loc: str, event_loc: str, errors: _Errors) -> None:
    state = data.get("state")
    if state not in ENGINE_STATES:
        errors.add(f"{loc}.state", f"must be one of {', '.join(ENGINE_STATES)}, got {state!r}"[:200])
    reason = data.get("reason")
    if reason is not None and not isinstance(reason, str):
        errors.add(f"{loc}.reason", "must be a string")


def _check_heartbeat(event: dict, data: dict, loc: str, event_loc: str, errors: _Errors) -> None:
    return None


_DATA_CHECKS = {
    "metrics": _check_metrics,
    "samples": _check_samples,
    "checkpoint": _check_checkpoint,
    "log": _check_log,
    "status": _check_status,
    "heartbeat": _check_heartbeat,
}
