"""Pydantic's validation errors as the config's field errors: dotted paths the form can address,
cross-field errors at the field they name, typo suggestions for unknown keys."""

from __future__ import annotations

import difflib
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from rl_engine.config.errors import ConfigError, FieldErrors
from rl_engine.config.schema import REWARD_TYPES, RunConfig
from rl_engine.config.schema.rewards import _RewardBase


def config_error_from(exc: ValidationError) -> ConfigError:
    out: list[dict[str, str]] = []
    for err in exc.errors():
        raw_loc = tuple(err["loc"])
        loc = _clean_loc(raw_loc)
        ctx = err.get("ctx") or {}
        cause = ctx.get("error")
        if isinstance(cause, FieldErrors):
            prefix = ".".join(str(p) for p in loc)
            for sub_loc, msg in cause.errors:
                out.append({"loc": f"{prefix}.{sub_loc}" if prefix else sub_loc, "msg": msg})
            continue
        kind = err["type"]
        msg = err["msg"]
        if kind == "value_error" and msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        elif kind == "extra_forbidden":
            msg = _unknown_field_message(raw_loc)
        elif kind in ("union_tag_invalid", "union_tag_not_found"):
            loc = (*loc, "type")
            given = ctx.get("tag")
            msg = (
                f"unknown reward type {given!r}; expected one of: {', '.join(REWARD_TYPES)}"
                if kind == "union_tag_invalid"
                else f"missing reward type; expected one of: {', '.join(REWARD_TYPES)}"
            )
        out.append({"loc": ".".join(str(p) for p in loc), "msg": msg})
    return ConfigError(out)


def _clean_loc(loc: tuple) -> tuple:
    """Drop the discriminator tag pydantic inserts for tagged unions: rewards.0.regex.pattern →
    rewards.0.pattern (the form addresses the list item, not the union member)."""
    if len(loc) >= 3 and loc[0] == "rewards" and isinstance(loc[1], int) and loc[2] in REWARD_TYPES:
        return (*loc[:2], *loc[3:])
    return loc


def _unknown_field_message(raw_loc: tuple) -> str:
    field = str(raw_loc[-1])
    model = _model_at(raw_loc[:-1])
    if model is None:
        return f"unknown field {field!r}"
    allowed = list(model.model_fields)
    close = difflib.get_close_matches(field, allowed, n=1)
    if close:
        return f"unknown field {field!r} (did you mean {close[0]!r}?)"
    return f"unknown field {field!r}; allowed: {', '.join(allowed)}"


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model class a (raw pydantic) loc points into, for typo suggestions."""
    tp: Any = RunConfig
    for part in loc:
        tp = _step(tp, part)
        if tp is None:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    return tp


def _step(tp: Any, part: Any) -> Any:
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(str(part))
        return field.annotation if field else None
    origin = get_origin(tp)
    if origin is list and isinstance(part, int):
        return get_args(tp)[0]
    if origin in (Union, types.UnionType):
        for member in get_args(tp):
            if (
                isinstance(member, type)
                and issubclass(member, _RewardBase)
                and member.model_fields["type"].default == part
            ):
                return member
    return None
