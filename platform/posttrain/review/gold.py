"""Gold items drawn from a registered dataset: the spec and the rows (no database).

A campaign may mix in a share of items whose answers are known, shown to annotators like any other item
(nothing marks them). They come from a dataset's rows, its labels being the known answers:

  single campaigns  {"dataset": <id>, "share": 0.1, "question": "correct", "response_field": "response"}
                    each row gives the prompt (the dataset's prompt field), a response (`response_field`)
                    and, in the dataset's label field, the known answer to `question` (a pass/fail or
                    rating question; default the first of those): pass/fail as true/false, pass/fail,
                    yes/no or 1/0; a rating as an integer on the question's scale.
  pair campaigns    {"dataset": <id>, "share": 0.1, "chosen_field": "chosen", "rejected_field": "rejected"}
                    a preference dataset (TRL's {"prompt", "chosen", "rejected"}): the known answer to the
                    first pairwise question is the chosen response (A/B order is shuffled like any pair's).

`share` is the fraction of the campaign's items that are gold (above 0, at most 0.5): with n sampled
items, ceil(share · n / (1 − share)) gold rows are added, picked at random (by the source's seed) among
the dataset's rows. Gold rows have no run, so they need a blind campaign (one that is not blind shows
each response's run and reward, and a response without one would stand out).

The owner may also mark any item as gold with its known answers (posttrain.review.services.item_gold_set).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from posttrain.core.errors import InvalidInput
from posttrain.core.json_values import json_integer

MAX_SHARE = 0.5
MAX_GOLD_DATASET_ROWS = 50_000
_SINGLE_FIELDS = {"dataset", "share", "question", "response_field"}
_PAIR_FIELDS = {"dataset", "share", "chosen_field", "rejected_field"}
_TRUE = {"true", "pass", "yes", "1"}
_FALSE = {"false", "fail", "no", "0"}


@dataclass(frozen=True)
class GoldRow:
    row: int  # the dataset row, from 0
    prompt: str
    response_a: str
    response_b: str | None
    answers: dict[str, Any]  # question key -> known answer, as stored ("A" = response_a)


def validate_gold_spec(raw: Any, campaign_kind: str, questions: list[dict[str, Any]], blind: bool) -> dict | None:
    """The normalised spec (None for no gold); InvalidInput naming each bad field (`gold.share`)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InvalidInput.one("gold", "must be an object with dataset and share (or null for no gold)")
    allowed = _SINGLE_FIELDS if campaign_kind == "single" else _PAIR_FIELDS
    errors = [
        {"loc": f"gold.{name}"[:300], "msg": f"unknown field (the fields: {', '.join(sorted(allowed))})"}
        for name in sorted(set(raw) - allowed)
    ]
    dataset = json_integer(raw.get("dataset"))
    if dataset is None or dataset < 1:
        errors.append({"loc": "gold.dataset", "msg": "required: the id of a registered dataset"})
    share = raw.get("share")
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= MAX_SHARE:
        errors.append({"loc": "gold.share", "msg": f"must be a number above 0 and at most {MAX_SHARE}"})
    if not blind:
        errors.append({"loc": "gold", "msg": "gold rows have no run: they need a blind campaign to stay unmarked"})
    spec: dict[str, Any] = {"dataset": dataset, "share": share}
    if campaign_kind == "single":
        spec["question"] = _gold_question(raw.get("question"), questions, errors)
        spec["response_field"] = _field_name(raw.get("response_field", "response"), "gold.response_field", errors)
    else:
        spec["question"] = next(q["key"] for q in questions if q["kind"] == "pairwise")
        spec["chosen_field"] = _field_name(raw.get("chosen_field", "chosen"), "gold.chosen_field", errors)
        spec["rejected_field"] = _field_name(raw.get("rejected_field", "rejected"), "gold.rejected_field", errors)
    if errors:
        raise InvalidInput(errors)
    return spec


def _gold_question(key: Any, questions: list[dict[str, Any]], errors: list[dict[str, str]]) -> str | None:
    answerable = [q["key"] for q in questions if q["kind"] in ("pass_fail", "rating")]
    if key is None:
        if not answerable:
            errors.append({"loc": "gold.question", "msg": "gold rows answer a pass/fail or rating question: add one"})
            return None
        return answerable[0]
    if key not in answerable:
        errors.append(
            {"loc": "gold.question", "msg": f"must name a pass/fail or rating question ({', '.join(answerable)})"}
        )
        return None
    return key


def _field_name(value: Any, loc: str, errors: list[dict[str, str]]) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 200:
        errors.append({"loc": loc, "msg": "must be a column name"})
        return ""
    return value.strip()


def gold_count(share: float, sampled: int) -> int:
    """Gold rows to add to `sampled` items so that `share` of all items are gold."""
    return math.ceil(share * sampled / (1.0 - share))


def known_answer(question: dict[str, Any], value: Any) -> Any:
    """A dataset label as the known answer to a pass/fail or rating question; None when it is not one."""
    if question["kind"] == "pass_fail":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower() if isinstance(value, (str, int)) else ""
        return True if text in _TRUE else False if text in _FALSE else None
    rating = json_integer(value)
    if rating is None and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        rating = int(value.strip())
    return rating if rating is not None and question["min"] <= rating <= question["max"] else None


def gold_rows(
    rows: list[dict[str, Any]],
    spec: dict[str, Any],
    questions: list[dict[str, Any]],
    *,
    prompt_field: str,
    label_field: str,
    count: int,
    seed: int,
) -> list[GoldRow]:
    """`count` rows of the dataset as gold items, picked at random by `seed`. InvalidInput names the first
    bad row and field (never its content: the dataset may be someone else's upload)."""
    if len(rows) < count:
        raise InvalidInput.one(
            "gold.share",
            f"needs {count} gold rows for this share of the campaign's items; the dataset has {len(rows)}: "
            "lower the share or use a larger dataset",
        )
    question = next(q for q in questions if q["key"] == spec["question"])
    pair = question["kind"] == "pairwise"
    if not pair and not label_field:
        raise InvalidInput.one("gold.dataset", "the dataset has no label field: its labels are the known answers")
    numbers = sorted(random.Random(f"{seed}:gold").sample(range(len(rows)), count))
    picked = []
    for number in numbers:
        row = rows[number]
        where = f"row {number + 1}"
        prompt = row.get(prompt_field)
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidInput.one("gold.dataset", f"{where}: the prompt field {prompt_field!r} is not a text")
        if pair:
            chosen, rejected = row.get(spec["chosen_field"]), row.get(spec["rejected_field"])
            for name, text in (("chosen_field", chosen), ("rejected_field", rejected)):
                if not isinstance(text, str):
                    raise InvalidInput.one(f"gold.{name}", f"{where}: column {spec[name]!r} is missing or not a text")
            picked.append(GoldRow(number, prompt, str(chosen), str(rejected), {question["key"]: "A"}))
            continue
        response = row.get(spec["response_field"])
        if not isinstance(response, str):
            raise InvalidInput.one(
                "gold.response_field", f"{where}: column {spec['response_field']!r} is missing or not a text"
            )
        answer = known_answer(question, row.get(label_field))
        if answer is None:
            expected = (
                "true/false"
                if question["kind"] == "pass_fail"
                else f"an integer from {question['min']} to {question['max']}"
            )
            raise InvalidInput.one(
                "gold.dataset",
                f"{where}: the label ({label_field!r}) is not an answer to {question['key']!r}: {expected}",
            )
        picked.append(GoldRow(number, prompt, response, None, {question["key"]: answer}))
    return picked
