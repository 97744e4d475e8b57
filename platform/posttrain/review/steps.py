"""Step-level labels: a response cut into steps, the annotator's "first wrong step", and its export in the
style of PRM800K for training a process reward model (no database).

The steps of a response (`split_steps`), the rule annotators see applied:

  1. each line is cut off from the next at its line break (solutions are usually one step a line);
  2. within a line, a sentence ends at `.`, `!` or `?` (one or more) followed by whitespace, so "3.5"
     and "x=2.5." stay whole but "It is 4. So" is two steps;
  3. whitespace around a step belongs to no step, and a step is never empty.

An answer to a `steps` question is `{"first_wrong": k}` (the k-th step, from 0, is the first one that is
wrong) or `{"first_wrong": null}` (no step is wrong). Where the item has a per-token view and the
question's unit is "token", the annotator marks the first wrong span of tokens instead,
`{"tokens": [start, end]}` (end exclusive); it is stored with the step that holds the span's first
character that is not whitespace (tokens often begin with the space before a word) as its `first_wrong`,
so agreement, gold checks and the export read one field either way.

The export, one JSON line per item whose label is known (`prm_record`):

  {"prompt": "...", "steps": ["step 1", "step 2", "step 3"], "labels": [1, 1, -1]}

PRM800K's ratings: 1 for a correct step, -1 for the first wrong one; the steps after it are left out,
as PRM800K's labellers stopped at the first mistake (what follows it is not known to be right or wrong).
A response with no wrong step has every step, all labelled 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from posttrain.core.errors import InvalidInput
from posttrain.core.json_values import json_integer

_LINE = re.compile(r"[^\n]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
CORRECT, WRONG = 1, -1


@dataclass(frozen=True)
class ResponseSteps:
    """A response cut into steps: each step's text and the offset of its first character, and, where the
    item has a per-token view, the offset of each token (the pieces joined give the response)."""

    texts: list[str]
    starts: list[int]
    token_starts: list[int] | None = None
    token_pieces: list[str] | None = None

    def step_of_char(self, offset: int) -> int:
        """The step holding the character at `offset` (a character between steps: the step before it)."""
        found = 0
        for i, start in enumerate(self.starts):
            if start <= offset:
                found = i
        return found


def split_steps(text: str, tokens: dict[str, Any] | None = None) -> ResponseSteps:
    """The steps of a response by the rule in the module doc; `tokens` is the item's per-token view."""
    texts: list[str] = []
    starts: list[int] = []
    for line in _LINE.finditer(text):
        piece_start = line.start()
        for boundary in [*_SENTENCE_END.finditer(line.group()), None]:
            piece_end = line.end() if boundary is None else line.start() + boundary.start()
            piece = text[piece_start:piece_end]
            if piece.strip():
                texts.append(piece.strip())
                starts.append(piece_start + len(piece) - len(piece.lstrip()))
            if boundary is not None:
                piece_start = line.start() + boundary.end()
    pieces = _token_pieces(tokens)
    return ResponseSteps(texts, starts, _token_starts(pieces), pieces)


def _token_pieces(tokens: dict[str, Any] | None) -> list[str] | None:
    pieces = (tokens or {}).get("text")
    if not isinstance(pieces, list) or not pieces or not all(isinstance(p, str) for p in pieces):
        return None
    return pieces


def _token_starts(pieces: list[str] | None) -> list[int] | None:
    if pieces is None:
        return None
    starts, offset = [], 0
    for piece in pieces:
        starts.append(offset)
        offset += len(piece)
    return starts


def uses_tokens(question: dict[str, Any], steps: ResponseSteps) -> bool:
    """A token-unit question marks tokens only where the item has a per-token view; else sentences."""
    return question.get("unit") == "token" and steps.token_starts is not None


def check_step_answer(question: dict[str, Any], value: dict[str, Any], steps: ResponseSteps, loc: str) -> dict:
    """The answer normalised against the item's steps (see the module doc); InvalidInput naming `loc`."""
    if value.get("first_wrong") is None and "tokens" not in value:
        return {"first_wrong": None}
    if "tokens" in value:
        if not uses_tokens(question, steps):
            raise InvalidInput.one(f"{loc}.tokens", "this item is labelled by sentence: give first_wrong")
        span = value["tokens"]
        start, end = (json_integer(v) for v in span) if isinstance(span, list) and len(span) == 2 else (None, None)
        count = len(steps.token_starts or [])
        if start is None or end is None or not 0 <= start < end <= count:
            raise InvalidInput.one(f"{loc}.tokens", f"must be [start, end] with 0 ≤ start < end ≤ {count} (tokens)")
        return {"first_wrong": steps.step_of_char(_first_visible(steps, start, end)), "tokens": [start, end]}
    first = json_integer(value.get("first_wrong"))
    if first is None or not 0 <= first < len(steps.texts):
        raise InvalidInput.one(
            f"{loc}.first_wrong", f"must be a step from 0 to {len(steps.texts) - 1}, or null when no step is wrong"
        )
    return {"first_wrong": first}


def _first_visible(steps: ResponseSteps, start: int, end: int) -> int:
    """The offset of the span's first character that is not whitespace (its start if it is all whitespace)."""
    offset = (steps.token_starts or [])[start]
    text = "".join((steps.token_pieces or [])[start:end])
    return offset + (len(text) - len(text.lstrip()) if text.strip() else 0)


def first_wrong(value: Any) -> int | None:
    """The first wrong step of an answer; None for "no step is wrong" (and for no answer)."""
    return value.get("first_wrong") if isinstance(value, dict) else None


def prm_record(prompt: str, steps: ResponseSteps, wrong_at: int | None) -> dict[str, Any]:
    """The PRM800K-style line of a labelled response (see the module doc)."""
    if wrong_at is None:
        return {"prompt": prompt, "steps": list(steps.texts), "labels": [CORRECT] * len(steps.texts)}
    kept = steps.texts[: wrong_at + 1]
    return {"prompt": prompt, "steps": kept, "labels": [CORRECT] * wrong_at + [WRONG]}
