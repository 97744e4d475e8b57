"""The questions of a campaign and the answers to them: validation and normalisation (no database).

A question is a JSON object:

    {"key": "quality", "kind": "rating", "label": "Overall quality", "required": true, "help": "...",
     "min": 1, "max": 5, "labels": ["awful", "poor", "ok", "good", "great"],
     "rubric": ["Wrong or off topic.", "...", "Right, complete and plain."]}     # rating
    {"key": "correct", "kind": "pass_fail", "label": "Is the answer correct?"}     # true / false
    {"key": "better", "kind": "pairwise", "label": "Which response is better?"}    # "A" | "B" | "tie" | "both_bad"
    {"key": "issues", "kind": "tags", "label": "Problems", "options": ["rude", "wrong"]}  # a list of options
    {"key": "note", "kind": "comment", "label": "Anything else?"}                   # free text
    {"key": "first_error", "kind": "steps", "label": "First wrong step", "unit": "sentence"}  # see steps.py

`required` defaults to true, except for tags and comments (an empty tag list is the answer "none apply").
`help` is the question's instructions and each `rubric` entry what one point of the scale means (one per
point, lowest first), both markdown (guidelines.py renders them). Pairwise questions exist only in pair
campaigns, a steps question (at most one: the first wrong step of the response, by sentence or, where the
item has a per-token view, `"unit": "token"`) only in single ones.
Every error names its field (`questions[2].max`, `answers.quality`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from posttrain.core.errors import InvalidInput
from posttrain.core.json_values import json_integer

QUESTION_KINDS: tuple[str, ...] = ("rating", "pass_fail", "pairwise", "tags", "comment", "steps")
# Questions with one right answer per item: gold answers, adjudication and judges apply to these.
GRADED_KINDS: tuple[str, ...] = ("pass_fail", "rating", "pairwise", "steps")
PAIRWISE_CHOICES: tuple[str, ...] = ("A", "B", "tie", "both_bad")
STEP_UNITS: tuple[str, ...] = ("sentence", "token")
_KEY = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
MAX_QUESTIONS = 20
MAX_LABEL_CHARS = 500
MAX_HELP_CHARS = 5000
MAX_SCALE_POINTS = 101
MAX_TAG_OPTIONS = 50
MAX_TAG_CHARS = 100
MAX_COMMENT_CHARS = 10_000
_COMMON_FIELDS = {"key", "kind", "label", "required", "help"}
_KIND_FIELDS = {"rating": {"min", "max", "labels", "rubric"}, "tags": {"options"}, "steps": {"unit"}}


def _text(value: Any, loc: str, errors: list[dict[str, str]], *, limit: int, required: bool) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        errors.append({"loc": loc, "msg": "must be a string"})
        return ""
    value = value.strip()
    if required and not value:
        errors.append({"loc": loc, "msg": "is required"})
    elif len(value) > limit:
        errors.append({"loc": loc, "msg": f"is {len(value)} characters long; at most {limit}"})
    elif "\x00" in value:
        errors.append({"loc": loc, "msg": "must not contain NUL characters"})
    return value


def validate_questions(raw: Any, campaign_kind: str) -> list[dict[str, Any]]:
    """The campaign's questions, normalised (defaults filled in); InvalidInput naming each bad field."""
    if not isinstance(raw, list) or not raw:
        raise InvalidInput.one("questions", "required: a list of at least one question")
    if len(raw) > MAX_QUESTIONS:
        raise InvalidInput.one("questions", f"at most {MAX_QUESTIONS} questions per campaign")
    errors: list[dict[str, str]] = []
    questions: list[dict[str, Any]] = []
    seen_keys: set[str] = set()
    for i, question in enumerate(raw):
        loc = f"questions[{i}]"
        if not isinstance(question, dict):
            errors.append({"loc": loc, "msg": "must be an object with key, kind and label"})
            continue
        checked = _question(question, loc, campaign_kind, errors)
        if checked is None:
            continue
        if checked["key"] in seen_keys:
            errors.append({"loc": f"{loc}.key", "msg": f"key {checked['key']!r} is used by an earlier question"})
        seen_keys.add(checked["key"])
        questions.append(checked)
    if not errors and campaign_kind == "pair" and not any(q["kind"] == "pairwise" for q in questions):
        errors.append(
            {"loc": "questions", "msg": "a pair campaign needs a pairwise question (which response is better)"}
        )
    if sum(q["kind"] == "steps" for q in questions) > 1:
        errors.append({"loc": "questions", "msg": "at most one steps question (the first wrong step) per campaign"})
    if errors:
        raise InvalidInput(errors)
    return questions


def _question(raw: dict[str, Any], loc: str, campaign_kind: str, errors: list[dict[str, str]]) -> dict[str, Any] | None:
    kind = raw.get("kind")
    if kind not in QUESTION_KINDS:
        errors.append({"loc": f"{loc}.kind", "msg": f"must be one of {', '.join(QUESTION_KINDS)}, got {kind!r}"[:300]})
        return None
    before = len(errors)
    unknown = sorted(set(raw) - _COMMON_FIELDS - _KIND_FIELDS.get(kind, set()))
    for name in unknown:
        errors.append({"loc": f"{loc}.{name}"[:300], "msg": f"unknown field for a {kind} question"})
    key = raw.get("key")
    if not isinstance(key, str) or not _KEY.match(key):
        errors.append(
            {"loc": f"{loc}.key", "msg": "must be 1-40 lowercase letters, digits or _, starting with a letter"}
        )
    if kind == "pairwise" and campaign_kind != "pair":
        errors.append({"loc": f"{loc}.kind", "msg": "pairwise questions need a pair campaign (kind 'pair')"})
    if kind == "steps" and campaign_kind != "single":
        errors.append({"loc": f"{loc}.kind", "msg": "steps questions label one response: a single campaign"})
    required = raw.get("required", kind not in ("tags", "comment"))
    if not isinstance(required, bool):
        errors.append({"loc": f"{loc}.required", "msg": "must be true or false"})
    question: dict[str, Any] = {
        "key": key,
        "kind": kind,
        "label": _text(raw.get("label"), f"{loc}.label", errors, limit=MAX_LABEL_CHARS, required=True),
        "required": required,
        "help": _text(raw.get("help"), f"{loc}.help", errors, limit=MAX_HELP_CHARS, required=False),
    }
    question.update(_kind_fields(kind, raw, loc, errors))
    return question if len(errors) == before else None


def _kind_fields(kind: str, raw: dict[str, Any], loc: str, errors: list[dict[str, str]]) -> dict[str, Any]:
    """The fields only a question of this kind has (none for pass_fail and comment)."""
    if kind == "rating":
        return _rating_scale(raw, loc, errors)
    if kind == "tags":
        return {"options": _tag_options(raw.get("options"), f"{loc}.options", errors)}
    if kind == "pairwise":
        return {"choices": list(PAIRWISE_CHOICES)}
    if kind == "steps":
        unit = raw.get("unit", "sentence")
        if unit not in STEP_UNITS:
            errors.append({"loc": f"{loc}.unit", "msg": f"must be one of {', '.join(STEP_UNITS)}"})
        return {"unit": unit}
    return {}


def _rating_scale(raw: dict[str, Any], loc: str, errors: list[dict[str, str]]) -> dict[str, Any]:
    low, high = json_integer(raw.get("min")), json_integer(raw.get("max"))
    if low is None:
        errors.append({"loc": f"{loc}.min", "msg": "required: the lowest rating, an integer"})
    if high is None:
        errors.append({"loc": f"{loc}.max", "msg": "required: the highest rating, an integer"})
    if low is None or high is None:
        return {}
    if high <= low:
        errors.append({"loc": f"{loc}.max", "msg": f"must be greater than min ({low})"})
        return {}
    points = high - low + 1
    if points > MAX_SCALE_POINTS:
        errors.append({"loc": f"{loc}.max", "msg": f"the scale has {points} points; at most {MAX_SCALE_POINTS}"})
        return {}
    labels = raw.get("labels", [])
    if labels is None:
        labels = []
    if not isinstance(labels, list) or (labels and len(labels) != points):
        errors.append(
            {"loc": f"{loc}.labels", "msg": f"must be a list of {points} labels, one per point from {low} to {high}"}
        )
        return {}
    cleaned = [
        _text(label, f"{loc}.labels[{i}]", errors, limit=MAX_LABEL_CHARS, required=True)
        for i, label in enumerate(labels)
    ]
    rubric = raw.get("rubric") or []
    if not isinstance(rubric, list) or (rubric and len(rubric) != points):
        errors.append(
            {
                "loc": f"{loc}.rubric",
                "msg": f"must be a list of {points} descriptions, one per point from {low} to {high}",
            }
        )
        return {}
    described = [
        _text(text, f"{loc}.rubric[{i}]", errors, limit=MAX_HELP_CHARS, required=False) for i, text in enumerate(rubric)
    ]
    return {"min": low, "max": high, "labels": cleaned, "rubric": described}


def _tag_options(raw: Any, loc: str, errors: list[dict[str, str]]) -> list[str]:
    if not isinstance(raw, list) or not raw:
        errors.append({"loc": loc, "msg": "required: a list of at least one tag"})
        return []
    if len(raw) > MAX_TAG_OPTIONS:
        errors.append({"loc": loc, "msg": f"at most {MAX_TAG_OPTIONS} tags"})
        return []
    options: list[str] = []
    for i, option in enumerate(raw):
        text = _text(option, f"{loc}[{i}]", errors, limit=MAX_TAG_CHARS, required=True)
        if text and text in options:
            errors.append({"loc": f"{loc}[{i}]", "msg": f"tag {text!r} is listed twice"})
        options.append(text)
    return options


# --- answers ----------------------------------------------------------------------------------


def validate_answers(questions: list[dict[str, Any]], raw: Any, loc: str = "answers") -> dict[str, Any]:
    """An annotator's answers, normalised: unanswered optional questions are left out, tags follow the
    order of the options, comments are stripped. Pairwise answers stay as the annotator saw them."""
    if not isinstance(raw, dict):
        raise InvalidInput.one(loc, "must be an object of question key to answer")
    errors: list[dict[str, str]] = []
    known = {q["key"] for q in questions}
    for key in raw:
        if key not in known:
            errors.append(
                {"loc": f"{loc}.{key}"[:300], "msg": f"no question has this key (the keys: {', '.join(sorted(known))})"}
            )
    answers: dict[str, Any] = {}
    for question in questions:
        key = question["key"]
        here = f"{loc}.{key}"
        value = _answer(question, raw.get(key), here, errors)
        if value is None:
            if question["required"] and not any(e["loc"] == here for e in errors):
                errors.append({"loc": here, "msg": f"required: {question['label']}"})
            continue
        answers[key] = value
    if errors:
        raise InvalidInput(errors)
    return answers


def validate_known_answers(
    questions: list[dict[str, Any]], raw: Any, loc: str, required: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Answers to the graded questions only (a gold item's known answers, a reviewer's decision): each
    checked like an annotator's, the `required` keys present; pairwise "A" means the item's rollout_a."""
    if not isinstance(raw, dict) or not raw:
        raise InvalidInput.one(loc, "must be an object of question key to answer, with at least one answer")
    graded = {q["key"]: q for q in questions if q["kind"] in GRADED_KINDS}
    errors: list[dict[str, str]] = []
    answers: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in graded:
            errors.append(
                {"loc": f"{loc}.{key}"[:300], "msg": f"not a graded question (those: {', '.join(sorted(graded))})"}
            )
            continue
        normalised = _answer(graded[key], value, f"{loc}.{key}", errors)
        if normalised is not None:
            answers[key] = normalised
    for key in required:
        if key not in answers and not any(e["loc"] == f"{loc}.{key}" for e in errors):
            errors.append({"loc": f"{loc}.{key}", "msg": f"required: {graded[key]['label']}"})
    if errors:
        raise InvalidInput(errors)
    return answers


def _answer(question: dict[str, Any], value: Any, loc: str, errors: list[dict[str, str]]) -> Any:
    """The normalised answer, or None when there is none (an error is appended for a wrong one)."""
    if value is None:
        return None
    # comment: any kind without its own reader
    read = _ANSWER_READERS.get(question["kind"], _comment_answer)
    return read(question, value, loc, errors)


def _rating_answer(question: dict[str, Any], value: Any, loc: str, errors: list[dict[str, str]]) -> int | None:
    rating = json_integer(value)
    if rating is None or not question["min"] <= rating <= question["max"]:
        errors.append({"loc": loc, "msg": f"must be an integer from {question['min']} to {question['max']}"})
        return None
    return rating


def _pass_fail_answer(question: dict[str, Any], value: Any, loc: str, errors: list[dict[str, str]]) -> bool | None:
    if not isinstance(value, bool):
        errors.append({"loc": loc, "msg": "must be true (pass) or false (fail)"})
        return None
    return value


def _pairwise_answer(question: dict[str, Any], value: Any, loc: str, errors: list[dict[str, str]]) -> str | None:
    if value not in PAIRWISE_CHOICES:
        errors.append({"loc": loc, "msg": f"must be one of {', '.join(PAIRWISE_CHOICES)}"})
        return None
    return value


def _steps_answer(question: dict[str, Any], value: Any, loc: str, errors: list[dict[str, str]]) -> Any:
    return _step_answer(value, loc, errors)


def _tags_answer(question: dict[str, Any], value: Any, loc: str, errors: list[dict[str, str]]) -> list[str] | None:
    if not isinstance(value, list) or not all(isinstance(tag, str) for tag in value):
        errors.append({"loc": loc, "msg": "must be a list of tags"})
        return None
    unknown = [tag for tag in value if tag not in question["options"]]
    if unknown:
        errors.append(
            {"loc": loc, "msg": f"unknown tag {unknown[0][:100]!r}; the tags: {', '.join(question['options'])}"}
        )
        return None
    chosen = [option for option in question["options"] if option in value]
    return chosen if chosen or not question["required"] else None


def _comment_answer(question: dict[str, Any], value: Any, loc: str, errors: list[dict[str, str]]) -> str | None:
    if not isinstance(value, str):
        errors.append({"loc": loc, "msg": "must be a string"})
        return None
    text = value.strip()
    if len(text) > MAX_COMMENT_CHARS:
        errors.append({"loc": loc, "msg": f"is {len(text)} characters long; at most {MAX_COMMENT_CHARS}"})
        return None
    if "\x00" in text:
        errors.append({"loc": loc, "msg": "must not contain NUL characters"})
        return None
    return text or None


_AnswerReader = Callable[[dict[str, Any], Any, str, list[dict[str, str]]], Any]
_ANSWER_READERS: dict[str, _AnswerReader] = {
    "rating": _rating_answer,
    "pass_fail": _pass_fail_answer,
    "pairwise": _pairwise_answer,
    "steps": _steps_answer,
    "tags": _tags_answer,
}


def _step_answer(value: Any, loc: str, errors: list[dict[str, str]]) -> dict[str, Any] | None:
    """The shape of a steps answer; its indices are checked against the item's own steps by the service
    (posttrain.review.steps.check_step_answer), which knows the response."""
    if not isinstance(value, dict) or not set(value) <= {"first_wrong", "tokens"} or not value:
        errors.append(
            {
                "loc": loc,
                "msg": 'must be {"first_wrong": step} (from 0), {"first_wrong": null} when no step is wrong, '
                'or {"tokens": [start, end]}',
            }
        )
        return None
    return dict(value)


# --- pairwise answers: as shown vs as stored ---------------------------------------------------

_SWAPPED = {"A": "B", "B": "A"}


def swap_pairwise(questions: list[dict[str, Any]], answers: dict[str, Any], swap: bool) -> dict[str, Any]:
    """Pairwise answers between what the annotator saw and what is stored ("A" = the item's sample_a).

    The same mapping works both ways: when the item showed sample_b as A, "A" and "B" trade places."""
    if not swap:
        return dict(answers)
    pairwise = {q["key"] for q in questions if q["kind"] == "pairwise"}
    return {key: _SWAPPED.get(value, value) if key in pairwise else value for key, value in answers.items()}
