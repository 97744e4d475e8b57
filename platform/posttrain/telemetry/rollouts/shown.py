"""What an answer shows of a rollout row: each text and list cut in the query, and what was cut."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.telemetry.rollouts.filters import _quoted
from posttrain_sdk import rollout_files

_JSON_COLUMNS = ("components", "env")


# Every text and list is cut in the query (DuckDB's substring and list_slice), so a row costs the web
# process at most these, whatever the file holds; a row says what was cut in `truncated`: {what: its full
# length}, characters for a text, items for a list ("<column>.text": the longest item's characters where
# items were cut). A JSON text longer than JSON_CHARS is shown as {} (half an object is no object).
TEXT_CHARS = 16_384  # prompt, response
LABEL_CHARS = 4096
NAME_CHARS = 64  # finish_reason, a turn's role
JSON_CHARS = 16_384  # components, env
ERRORS_SHOWN = 16
ERROR_CHARS = 1000
TURNS_SHOWN = 32
TURN_CHARS = 4096
MAX_VIEW_TOKENS = 8192  # per-token lists and async segments
PIECE_CHARS = 64  # a token's text piece


@dataclass(frozen=True)
class Shown:
    """How a column is read: `select` (SQL, `$c` the column) and the measures that tell whether it was
    cut: (a suffix to the column's name in `truncated`, SQL of its full size, the size shown)."""

    select: str
    sizes: tuple[tuple[str, str, int], ...] = ()


def _text(chars: int) -> Shown:
    return Shown(f"substring($c, 1, {chars})", (("", "length($c)", chars),))


def _json(chars: int) -> Shown:
    return Shown(f"CASE WHEN length($c) <= {chars} THEN $c ELSE '{{}}' END", (("", "length($c)", chars),))


def _list(items: int, item: str = "", item_chars: int = 0, item_length: str = "length(x)") -> Shown:
    """The first `items` of a list; each item cut by `item` (SQL over x) when given."""
    sliced = f"list_slice($c, 1, {items})"
    if not item:
        return Shown(sliced, (("", "len($c)", items),))
    longest = f"list_max(list_transform($c, x -> {item_length}))"
    return Shown(f"list_transform({sliced}, x -> {item})", (("", "len($c)", items), (".text", longest, item_chars)))


_TURN = (
    f"{{'role': substring(x.role, 1, {NAME_CHARS}), 'text': substring(x.text, 1, {TURN_CHARS}), 'reward': x.reward}}"
)
SHOWN: dict[str, Shown] = {
    "prompt": _text(TEXT_CHARS),
    "response": _text(TEXT_CHARS),
    "label": _text(LABEL_CHARS),
    "finish_reason": _text(NAME_CHARS),
    "components": _json(JSON_CHARS),
    "env": _json(JSON_CHARS),
    "errors": _list(ERRORS_SHOWN, f"substring(x, 1, {ERROR_CHARS})", ERROR_CHARS),
    "turns": _list(TURNS_SHOWN, _TURN, TURN_CHARS, "length(x.text)"),
    "versions": _list(MAX_VIEW_TOKENS, "list_slice(x, 1, 2)", 2, "len(x)"),
    "token_text": _list(MAX_VIEW_TOKENS, f"substring(x, 1, {PIECE_CHARS})", PIECE_CHARS),
    **{c: _list(MAX_VIEW_TOKENS) for c in rollout_files.TOKEN_COLUMNS if c != "token_text"},
}


def _select(columns: Sequence[str], whole: Sequence[str] = ()) -> tuple[str, list[tuple[str, int]]]:
    """The SELECT list of `columns` as answers show them (a column in `whole` read as stored), and the
    size measures it adds: (`truncated`'s name, the size shown), in the order of their `__size_<i>` columns."""
    items: list[str] = []
    sizes: list[tuple[str, int]] = []
    for column in columns:
        quoted = _quoted(column)
        shown = None if column in whole else SHOWN.get(column)
        if shown is None:
            items.append(quoted)
            continue
        items.append(f"{shown.select.replace('$c', quoted)} AS {quoted}")
        for suffix, sql, limit in shown.sizes:
            items.append(f"{sql.replace('$c', quoted)} AS __size_{len(sizes)}")
            sizes.append((column + suffix, limit))
    return ", ".join(items), sizes


def _decode(row: dict[str, Any], sizes: Sequence[tuple[str, int]] = ()) -> dict[str, Any]:
    truncated: dict[str, int] = {}
    for i, (name, shown) in enumerate(sizes):
        size = row.pop(f"__size_{i}", None)
        if size is not None and size > shown:
            truncated[name] = int(size)
    for name in _JSON_COLUMNS:
        if name in row and isinstance(row[name], str):
            row[name] = json_object(row[name])
    for name in ("reward", "advantage"):
        value = row.get(name)
        if isinstance(value, float) and not math.isfinite(value):
            row[name] = None
    row["truncated"] = truncated
    return row


def json_object(text: str) -> dict[str, Any]:
    """A JSON column's object; {} for text that is not one (a file from another writer)."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
