"""Validation of an event batch posted by the engine (docs/ARCHITECTURE.md, "Events").

`parse_batch` turns the request body into clean events or raises InvalidInput whose errors name the
exact field (`events[3].seq`, `events[0].data.samples[5].reward`). The checks are what the store
needs to never fail later: a batch that passes here inserts without a database error.
"""

from __future__ import annotations

import math
import re
from typing import Any

from posttrain.core.errors import InvalidInput
from posttrain_sdk.event_log import EVENT_TYPES

MAX_EVENTS_PER_BATCH = 10_000
ENGINE_STATES = ("running", "succeeded", "failed", "preempted")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_MAX_ERRORS = 20  # per batch: enough to fix a broken sender, short enough to read
MAX_INT32 = 2**31 - 1  # steps, sample indexes and lengths are 32-bit columns
MAX_INT64 = 2**63 - 1  # seq is a 64-bit column


def _is_int(v: Any) -> bool:
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
    data = event.get("data")
    if "data" in event and not isinstance(data, dict):
        errors.add(f"{loc}.data", f"must be an object, got {type(data).__name__}")
        return
    if kind in EVENT_TYPES and isinstance(data, dict):
        _DATA_CHECKS[kind](event, data, f"{loc}.data", loc, errors)


def _check_metrics(event: dict, data: dict, loc: str, event_loc: str, errors: _Errors) -> None:
    if not _is_int(event.get("step")):
        errors.add(f"{event_loc}.step", "a metrics event needs its step")
    for name, value in data.items():
        if len(name) > 200:
            errors.add(f"{loc}.{name[:40]}…", "metric names are at most 200 characters")
        elif not _is_numberish(value):
            errors.add(f"{loc}.{name}", f'must be a number (or "nan"/"inf"), got {type(value).__name__}')


def _check_samples(event: dict, data: dict, loc: str, event_loc: str, errors: _Errors) -> None:
    if not _is_int(event.get("step")):
        errors.add(f"{event_loc}.step", "a samples event needs its step")
    samples = data.get("samples")
    if not isinstance(samples, list):
        errors.add(f"{loc}.samples", "required: a list of samples")
        return
    seen: set[int] = set()
    for j, s in enumerate(samples):
        sloc = f"{loc}.samples[{j}]"
        if not isinstance(s, dict):
            errors.add(sloc, f"must be an object, got {type(s).__name__}")
            continue
        index = s.get("index")
        if not _is_int(index) or not 0 <= index <= MAX_INT32:
            errors.add(f"{sloc}.index", f"must be an integer between 0 and {MAX_INT32}, got {index!r}"[:200])
        elif index in seen:
            errors.add(f"{sloc}.index", f"duplicate sample index {index} in this step")
        else:
            seen.add(index)
        for key in ("prompt", "response", "finish_reason"):
            if not isinstance(s.get(key), str):
                errors.add(f"{sloc}.{key}", "required: a string")
        reward = s.get("reward")
        if not _is_numberish(reward):
            errors.add(f"{sloc}.reward", f"must be a number, got {type(reward).__name__}")
        advantage = s.get("advantage")
        if not _is_numberish(advantage):
            errors.add(f"{sloc}.advantage", f"must be a number or null, got {type(advantage).__name__}")
        length = s.get("length")
        if not _is_int(length) or not 0 <= length <= MAX_INT32:
            errors.add(f"{sloc}.length", f"must be an integer between 0 and {MAX_INT32}, got {length!r}"[:200])
        group = s.get("group", 0)
        if not _is_int(group) or not -MAX_INT32 <= group <= MAX_INT32:
            errors.add(f"{sloc}.group", "must be a (32-bit) integer")
        if s.get("label") is not None and not isinstance(s["label"], (str, int, float)):
            errors.add(f"{sloc}.label", "must be a string, a number or null")
        if not isinstance(s.get("components", {}), dict):
            errors.add(f"{sloc}.components", "must be an object of component name to score")
        if not isinstance(s.get("errors", []), list):
            errors.add(f"{sloc}.errors", "must be a list of strings")
        if not isinstance(s.get("kept", True), bool):
            errors.add(f"{sloc}.kept", "must be true or false")
        _check_turns(s.get("turns", []), f"{sloc}.turns", errors)
        _check_token_view(s.get("tokens", {}), s.get("versions", []), sloc, errors)
        env = s.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(k, str) and _is_numberish(v) for k, v in env.items()):
            errors.add(f"{sloc}.env", "must be an object of name to number")


TOKEN_VIEW_ARRAYS = ("rollout_logprob", "trainer_logprob", "entropy", "advantage")
_BASE64 = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")


def _check_token_view(view: Any, versions: Any, sloc: str, errors: _Errors) -> None:
    """A sample's per-token view (rl_engine/token_view.py): token pieces, base64 float16 arrays of as
    many values; and its segments' policy versions, [[version, tokens]]."""
    if not isinstance(view, dict):
        errors.add(f"{sloc}.tokens", "must be an object")
        return
    pieces = view.get("text", [])
    if not isinstance(pieces, list) or not all(isinstance(p, str) for p in pieces):
        errors.add(f"{sloc}.tokens.text", "must be a list of strings")
        return
    for name in set(view) - {"text", *TOKEN_VIEW_ARRAYS}:
        errors.add(f"{sloc}.tokens.{name}"[:200], f"unknown field (known: text, {', '.join(TOKEN_VIEW_ARRAYS)})")
    for name in TOKEN_VIEW_ARRAYS:
        packed = view.get(name)
        if packed is None:
            continue
        if not isinstance(packed, str) or not _BASE64.match(packed) or len(packed) != 4 * -(-2 * len(pieces) // 3):
            errors.add(f"{sloc}.tokens.{name}", f"must be base64 float16, one value per token ({len(pieces)})")
    if not isinstance(versions, list) or not all(
        isinstance(v, list) and len(v) == 2 and all(_is_int(x) and 0 <= x <= MAX_INT32 for x in v) for v in versions
    ):
        errors.add(f"{sloc}.versions", "must be a list of [policy version, tokens]")


def _check_turns(turns: Any, loc: str, errors: _Errors) -> None:
    """A multi-turn sample's trajectory, in order: the model's turns and the environment's answers."""
    if not isinstance(turns, list):
        errors.add(loc, "must be a list of {role, text, reward}")
        return
    for k, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("role") not in ("assistant", "environment"):
            errors.add(f"{loc}[{k}].role", "must be 'assistant' or 'environment'")
        elif not isinstance(turn.get("text"), str):
            errors.add(f"{loc}[{k}].text", "required: a string")
        elif not _is_numberish(turn.get("reward")):
            errors.add(f"{loc}[{k}].reward", "must be a number or null")


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
