"""A registry reward's `spec` is one engine `RewardSpec` (rl_engine.config): validated here with the
engine's own schema, so a spec accepted by the registry is accepted by a run config, and field
errors read exactly as the engine words them (prefixed `spec.<field>`).

`weight` is not part of a registered reward: it belongs to the experiment that uses it.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, get_args

from pydantic import BaseModel, TypeAdapter, ValidationError

from rl_engine.spec.config import REWARD_TYPES, RewardSpec

BUILTIN_TYPES: tuple[str, ...] = ("exact_match", "boxed_math", "regex", "length_penalty", "reasoning_gym", "verifiers")
KINDS: tuple[str, ...] = ("builtin", "python", "http", "reward_model")

_ADAPTER: TypeAdapter = TypeAdapter(RewardSpec)
_CLASSES: dict[str, type[BaseModel]] = {
    cls.model_fields["type"].default: cls for cls in get_args(get_args(RewardSpec)[0])
}
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")


class RewardSpecError(ValueError):
    """Field errors of a spec: {"spec.pattern": ["invalid regular expression: ..."], ...}."""

    def __init__(self, errors: dict[str, list[str]]):
        self.errors = errors
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))


def component_name(reward_name: str, kind: str) -> str:
    """The metric-safe component name (`reward/<name>` in the curves) for a registry name."""
    return _NAME_UNSAFE.sub("_", reward_name).strip("_.-") or kind


def validate_reward_spec(kind: str, spec: Any, default_name: str = "") -> dict[str, Any]:
    """The normalised spec (every field, defaults filled in, no weight) or RewardSpecError."""
    if kind not in KINDS:
        raise RewardSpecError({"kind": [f"unknown kind {kind!r}; expected one of: {', '.join(KINDS)}"]})
    if not isinstance(spec, dict):
        raise RewardSpecError({"spec": [f"must be a JSON object, got {type(spec).__name__}"]})
    spec = dict(spec)
    if "weight" in spec:
        raise RewardSpecError(
            {"spec.weight": ["set the weight where an experiment uses the reward, not on the reward"]}
        )
    _check_type(kind, spec)
    if default_name and not spec.get("name"):
        spec["name"] = default_name
    try:
        validated = _ADAPTER.validate_python(spec)
    except ValidationError as exc:
        raise RewardSpecError(_field_errors(exc)) from None
    normalized = validated.model_dump(mode="json", exclude={"weight"})
    _refuse_nul(normalized, "spec")
    return normalized


def _refuse_nul(value: Any, loc: str) -> None:
    """The spec is stored as JSON, and Postgres refuses NUL characters in it."""
    if isinstance(value, str) and "\x00" in value:
        raise RewardSpecError({loc: ["must not contain NUL characters"]})
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_nul(key, loc)
            _refuse_nul(item, f"{loc}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_nul(item, f"{loc}.{i}")


def _check_type(kind: str, spec: dict[str, Any]) -> None:
    given = spec.get("type")
    if kind == "builtin":
        if given is None:
            raise RewardSpecError({"spec.type": [f"required for a builtin reward; one of: {', '.join(BUILTIN_TYPES)}"]})
        if given not in BUILTIN_TYPES:
            known = given in REWARD_TYPES
            raise RewardSpecError(
                {
                    "spec.type": [
                        f"{given!r} is not a builtin reward type; expected one of: {', '.join(BUILTIN_TYPES)}"
                        + (f" (or use kind {given!r})" if known else "")
                    ]
                }
            )
        return
    if given is None:
        spec["type"] = kind
    elif given != kind:
        raise RewardSpecError({"spec.type": [f"must be {kind!r} for kind {kind!r}, got {given!r}"]})


def _field_errors(exc: ValidationError) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for err in exc.errors():
        loc = list(err["loc"])
        member = _CLASSES.get(loc[0]) if loc and isinstance(loc[0], str) else None
        if member is not None:
            loc = loc[1:]  # pydantic puts the union tag first: regex.pattern -> pattern
        msg = err["msg"]
        kind = err["type"]
        if kind == "value_error" and msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        elif kind == "extra_forbidden":
            msg = _unknown_field(str(loc[-1]), member)
        elif kind in ("union_tag_invalid", "union_tag_not_found"):
            loc = ["type"]
            msg = f"unknown reward type {_union_tag(err)!r}; expected one of: {', '.join(REWARD_TYPES)}"
        key = ".".join(["spec", *map(str, loc)])
        out.setdefault(key, []).append(msg)
    return out


def _union_tag(err: Any) -> Any:
    return (err.get("ctx") or {}).get("tag")


def _unknown_field(field: str, member: type[BaseModel] | None) -> str:
    if member is None:
        return f"unknown field {field!r}"
    allowed = [name for name in member.model_fields if name != "weight"]
    close = difflib.get_close_matches(field, allowed, n=1)
    if close:
        return f"unknown field {field!r} (did you mean {close[0]!r}?)"
    return f"unknown field {field!r}; allowed: {', '.join(allowed)}"
