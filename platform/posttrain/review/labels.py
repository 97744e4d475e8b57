"""An item's label and who to trust for it: gold accuracy, annotator weights, disagreement that needs a
reviewer, the final label, and a judge's answer from its scores (pure functions, no database).

**Graded questions** (`GRADED_KINDS`: pass/fail, rating, pairwise, steps) have one right answer per item;
tags and comments do not, so none of this applies to them.

**Gold.** A gold item carries known answers (some or all of its graded questions). An annotator's gold
accuracy is the share of their answers to gold questions on gold items that equal the known answer
(exactly: a rating one point off is wrong; a steps answer must name the same first wrong step). The
campaign's gold policy then weighs each annotator's judgements:

  min_items     gold answers needed before the accuracy counts (default 3): below it the annotator
                keeps weight 1, there is not enough evidence either way;
  min_accuracy  an annotator whose counted accuracy is below it is set aside: weight 0, their
                judgements do not count towards labels or exports (default 0: nobody is);
  weighting     "none" (default): everyone kept weighs 1; "accuracy": a kept annotator's judgements
                weigh their accuracy (Dawid–Skene's intuition without its EM: trust what was checked).

**Labels.** Per graded question: on a gold item the known answer; else a reviewer's decision; else the
annotators' weighted vote: pass/fail, pairwise and steps the strict weighted plurality (None when the top
answers weigh the same), ratings the weighted mean (a float).

**Disagreement.** A complete item goes to the reviewers when, on some graded question, its annotators
gave different answers (pass/fail, pairwise, steps) or ratings `rating_spread` points apart or more.

**A judge's answer** from a reward's scores: pass/fail is score ≥ threshold; a rating maps the score
linearly from [score_min, score_max] onto the scale, rounded and clipped; pairwise prefers the response
with the higher score ("tie" when equal). A judge does not answer steps, tags or comments.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.core.errors import InvalidInput
from posttrain.review.agreement import NO_WRONG_STEP, Answered
from posttrain.review.questions import GRADED_KINDS

WEIGHTINGS: tuple[str, ...] = ("none", "accuracy")
GOLD_POLICY_DEFAULTS: dict[str, Any] = {"min_items": 3, "min_accuracy": 0.0, "weighting": "none"}
MAX_GOLD_MIN_ITEMS = 1000


def graded(questions: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [q for q in questions if q["kind"] in GRADED_KINDS]


def graded_value(question: dict[str, Any], value: Any) -> Hashable | None:
    """The answer as a comparable value: a steps answer is its first wrong step (NO_WRONG_STEP for none)."""
    if value is None:
        return None
    if question["kind"] == "steps":
        first = value.get("first_wrong") if isinstance(value, dict) else None
        return NO_WRONG_STEP if first is None else first
    return value


def validate_gold_policy(raw: Any) -> dict[str, Any]:
    """The policy with its defaults filled in; InvalidInput naming each bad field (`gold_policy.weighting`)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidInput.one("gold_policy", "must be an object with min_items, min_accuracy and weighting")
    errors = [
        {"loc": f"gold_policy.{name}"[:300], "msg": "unknown field (the fields: min_accuracy, min_items, weighting)"}
        for name in sorted(set(raw) - set(GOLD_POLICY_DEFAULTS))
    ]
    policy = {**GOLD_POLICY_DEFAULTS, **raw}
    items = policy["min_items"]
    if isinstance(items, bool) or not isinstance(items, int) or not 1 <= items <= MAX_GOLD_MIN_ITEMS:
        errors.append({"loc": "gold_policy.min_items", "msg": f"must be an integer from 1 to {MAX_GOLD_MIN_ITEMS}"})
    accuracy = policy["min_accuracy"]
    if isinstance(accuracy, bool) or not isinstance(accuracy, (int, float)) or not 0.0 <= accuracy <= 1.0:
        errors.append({"loc": "gold_policy.min_accuracy", "msg": "must be a number from 0 to 1"})
    else:
        policy["min_accuracy"] = float(accuracy)
    if policy["weighting"] not in WEIGHTINGS:
        errors.append({"loc": "gold_policy.weighting", "msg": f"must be one of {', '.join(WEIGHTINGS)}"})
    if errors:
        raise InvalidInput(errors)
    return policy


# --- gold ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GoldCheck:
    """One annotator against the gold items they judged."""

    annotator: str
    answered: int  # gold answers compared (gold items × their known questions the annotator answered)
    correct: int
    accuracy: float | None  # None without any gold answer
    counted: bool  # answered ≥ the policy's min_items
    set_aside: bool
    weight: float


def gold_checks(
    questions: Sequence[dict[str, Any]],
    gold: dict[int, dict[str, Any]],
    rows: Iterable[Answered],
    policy: dict[str, Any],
) -> dict[str, GoldCheck]:
    """Each annotator's gold accuracy and weight (see the module doc), over `gold` (item -> known answers)."""
    by_key = {q["key"]: q for q in graded(questions)}
    answered: dict[str, int] = defaultdict(int)
    correct: dict[str, int] = defaultdict(int)
    annotators: set[str] = set()
    for row in rows:
        annotators.add(row.annotator)
        for key, known in (gold.get(row.item) or {}).items():
            question = by_key.get(key)
            given = row.answers.get(key)
            if question is None or given is None or known is None:
                continue
            answered[row.annotator] += 1
            correct[row.annotator] += graded_value(question, given) == graded_value(question, known)
    checks = {}
    for annotator in sorted(annotators):
        n = answered[annotator]
        accuracy = correct[annotator] / n if n else None
        counted = accuracy is not None and n >= policy["min_items"]
        set_aside = accuracy is not None and counted and accuracy < policy["min_accuracy"]
        if set_aside:
            weight = 0.0
        elif accuracy is not None and counted and policy["weighting"] == "accuracy":
            weight = accuracy
        else:
            weight = 1.0
        checks[annotator] = GoldCheck(annotator, n, correct[annotator], accuracy, counted, set_aside, weight)
    return checks


# --- labels -------------------------------------------------------------------------------------


def weighted_vote(question: dict[str, Any], votes: Sequence[tuple[Any, float]]) -> Any:
    """The label of one question from (answer, weight) pairs: see the module doc. None when undecided."""
    votes = [(value, weight) for value, weight in votes if value is not None and weight > 0]
    if not votes:
        return None
    if question["kind"] == "rating":
        total = sum(weight for _, weight in votes)
        return sum(value * weight for value, weight in votes) / total
    weights: dict[Hashable, float] = defaultdict(float)
    originals: dict[Hashable, Any] = {}
    for value, weight in votes:
        key = graded_value(question, value)
        weights[key] += weight
        originals.setdefault(key, value)
    ranked = sorted(weights.items(), key=lambda kv: -kv[1])
    if len(ranked) > 1 and math.isclose(ranked[0][1], ranked[1][1]):
        return None
    return originals[ranked[0][0]]


@dataclass(frozen=True)
class Label:
    value: Any
    source: str  # "gold", "decision" or "annotators"


def item_labels(
    questions: Sequence[dict[str, Any]],
    rows: Sequence[Answered],
    weights: dict[str, float],
    *,
    gold: dict[str, Any] | None = None,
    decision: dict[str, Any] | None = None,
) -> dict[str, Label]:
    """One item's labels per graded question that has one (see the module doc)."""
    labels = {}
    for question in graded(questions):
        key = question["key"]
        if gold and gold.get(key) is not None:
            labels[key] = Label(gold[key], "gold")
        elif decision and decision.get(key) is not None:
            labels[key] = Label(decision[key], "decision")
        else:
            value = weighted_vote(question, [(row.answers.get(key), weights.get(row.annotator, 1.0)) for row in rows])
            if value is not None:
                labels[key] = Label(value, "annotators")
    return labels


def disagreeing_questions(
    questions: Sequence[dict[str, Any]], answers: Sequence[dict[str, Any]], rating_spread: int
) -> list[str]:
    """The graded questions on which these judgements of one item disagree (see the module doc)."""
    keys = []
    for question in graded(questions):
        values = [graded_value(question, a.get(question["key"])) for a in answers]
        values = [v for v in values if v is not None]
        if len(values) < 2:
            continue
        if question["kind"] == "rating":
            ratings = [int(v) for v in values]  # type: ignore[call-overload]  # ratings are integers
            if max(ratings) - min(ratings) >= rating_spread:
                keys.append(question["key"])
        elif len(set(values)) > 1:
            keys.append(question["key"])
    return keys


def after_adjudication(rows: Sequence[Answered], decisions: dict[int, dict[str, Any]]) -> list[Answered]:
    """The judgements with each decided item's answers replaced by the reviewer's decision, question by
    question: the disagreement a decision settled counts as agreement ("after" in the agreement report)."""
    replaced = []
    for row in rows:
        decision = decisions.get(row.item)
        if decision:
            answers = {**row.answers, **{k: v for k, v in decision.items() if k in row.answers and v is not None}}
            row = Answered(item=row.item, annotator=row.annotator, answers=answers, seconds=row.seconds)
        replaced.append(row)
    return replaced


def rounded_rating(value: float) -> int:
    """A rating label (a weighted mean) as a point of its scale: halves round up."""
    return math.floor(value + 0.5)


# --- a judge's answers --------------------------------------------------------------------------


@dataclass(frozen=True)
class JudgeSettings:
    threshold: float = 0.5
    score_min: float = 0.0
    score_max: float = 1.0


def judge_answer(
    question: dict[str, Any], score_a: float | None, score_b: float | None, settings: JudgeSettings
) -> Any:
    """The judge's answer to one question from its score(s) (see the module doc); None when it has none."""
    kind = question["kind"]
    if kind == "pairwise":
        if score_a is None or score_b is None:
            return None
        return "A" if score_a > score_b else "B" if score_b > score_a else "tie"
    if score_a is None:
        return None
    if kind == "pass_fail":
        return score_a >= settings.threshold
    if kind == "rating":
        span = settings.score_max - settings.score_min
        share = 0.0 if span <= 0 else (score_a - settings.score_min) / span
        share = min(1.0, max(0.0, share))
        return question["min"] + rounded_rating(share * (question["max"] - question["min"]))
    return None
