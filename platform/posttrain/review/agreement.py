"""Inter-annotator agreement and per-annotator statistics: pure functions over plain values.

Which statistic, per question kind:

  pass_fail, pairwise  nominal: Krippendorff's alpha (nominal metric) and unweighted Cohen's kappa.
  rating               Krippendorff's alpha with the interval metric (δ² = (c − k)²: the scale's points
                       are equally spaced numbers) and Cohen's kappa quadratic-weighted over the scale's
                       points min..max (w = (i − j)² / (K − 1)²), the usual choice for ordered scales.
  tags                 each tag on its own as a yes/no (nominal) question: "did the annotator pick it?",
                       over the annotators who answered the question (an omitted answer is missing data,
                       an empty list says "none of these").
  steps                nominal on the first wrong step (-1 for "no step is wrong").
  comment              no agreement (free text).

A judge (a registered reward answering the questions from its scores, posttrain.review.labels) is compared
with the humans' labels per question by `judge_agreement`: Cohen's kappa as above, the confusion counts,
the items it gets wrong, and true/false positive rates with the humans as the truth. Positive: a pass
(pass/fail); a rating above the scale's midpoint; for pairwise, each response side ("A", "B") against
the rest. TPR = judge positive among human positives, FPR = judge positive among human negatives.

Krippendorff's alpha takes any number of annotators and missing answers (only items with two or more
answers count). Cohen's kappa is for two annotators: it is given for every pair of annotators who
judged common items, and as the question's `kappa` when exactly two annotators answered it.
Undefined values (no pairable items, or no expected disagreement, e.g. everyone always said "pass")
are None.

Definitions (Krippendorff 2011, "Computing Krippendorff's alpha-reliability"; Cohen 1960/1968):
  alpha = 1 − (n − 1) · Σ_ck o_ck δ²(c, k) / Σ_ck n_c n_k δ²(c, k), where o is the coincidence matrix
          (each ordered pair of values within a unit of m values adds 1/(m − 1)), n_c its row sums, n
          the number of pairable values.
  kappa = 1 − Σ_ij w_ij p_ij / Σ_ij w_ij p_i· p_·j with w_ij = 0 on the diagonal and 1 off it (nominal),
          which equals (p_o − p_e) / (1 − p_e).
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

WEIGHTINGS = (None, "linear", "quadratic")
NO_WRONG_STEP = -1  # a steps answer's value when no step is wrong


def cohen_kappa(
    pairs: Sequence[tuple[Hashable, Hashable]],
    *,
    categories: Sequence[Hashable] | None = None,
    weighting: str | None = None,
) -> float | None:
    """Cohen's kappa of two raters, one (rater 1, rater 2) pair per unit both rated.

    `weighting` None is nominal kappa; "linear" or "quadratic" weight disagreements by the distance
    between the categories' positions in `categories` (required then: the ordered scale)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}")
    if weighting is not None and categories is None:
        raise ValueError("weighted kappa needs the ordered categories")
    if not pairs:
        return None
    if categories is None:
        categories = sorted({value for pair in pairs for value in pair}, key=repr)
    position = {category: i for i, category in enumerate(categories)}
    span = len(categories) - 1
    if span < 1:
        return None

    def weight(i: int, j: int) -> float:
        if weighting is None:
            return 0.0 if i == j else 1.0
        distance = abs(i - j) / span
        return distance if weighting == "linear" else distance * distance

    n = len(pairs)
    observed: Counter[tuple[int, int]] = Counter((position[a], position[b]) for a, b in pairs)
    first = Counter(position[a] for a, _ in pairs)
    second = Counter(position[b] for _, b in pairs)
    disagreement_observed = sum(weight(i, j) * count for (i, j), count in observed.items()) / n
    disagreement_expected = sum(weight(i, j) * first[i] * second[j] for i in first for j in second) / (n * n)
    if disagreement_expected == 0:
        return None
    return 1.0 - disagreement_observed / disagreement_expected


def krippendorff_alpha(units: Iterable[Sequence[Any]], metric: str = "nominal") -> float | None:
    """Krippendorff's alpha over units (items), each the list of values its raters gave (missing ones left
    out); metric "nominal" or "interval"."""
    if metric not in ("nominal", "interval"):
        raise ValueError("metric must be nominal or interval")
    coincidence = _coincidence_matrix(units)
    totals: dict[Any, float] = defaultdict(float)
    for (c, _), o in coincidence.items():
        totals[c] += o
    n = sum(totals.values())
    if n <= 1:
        return None

    def delta(c: Any, k: Any) -> float:
        if metric == "nominal":
            return 0.0 if c == k else 1.0
        return float(c - k) ** 2

    observed = sum(o * delta(c, k) for (c, k), o in coincidence.items())
    expected = sum(totals[c] * totals[k] * delta(c, k) for c in totals for k in totals)
    if expected == 0:
        return None
    return 1.0 - (n - 1) * observed / expected


def _coincidence_matrix(units: Iterable[Sequence[Any]]) -> dict[tuple[Any, Any], float]:
    """Krippendorff's coincidence matrix: each value pair within a unit, weighted 1/(m - 1)."""
    coincidence: dict[tuple[Any, Any], float] = defaultdict(float)
    for values in units:
        m = len(values)
        if m < 2:
            continue  # a lone value pairs with nothing
        counts = Counter(values)
        for c, n_c in counts.items():
            for k, n_k in counts.items():
                pairs = n_c * (n_k - 1) if c == k else n_c * n_k
                if pairs:
                    coincidence[(c, k)] += pairs / (m - 1)
    return coincidence


# --- per campaign -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answered:
    """One judgement as agreement needs it: pairwise answers as stored ("A" = the item's sample_a)."""

    item: int
    annotator: str
    answers: dict[str, Any]
    seconds: float = 0.0


Table = dict[int, dict[str, Any]]  # item → annotator → value


def _table(rows: Iterable[Answered], key: str, value=lambda answer: answer) -> Table:
    table: Table = defaultdict(dict)
    for row in rows:
        if row.answers.get(key) is not None:
            table[row.item][row.annotator] = value(row.answers[key])
    return table


def _measures(table: Table, metric: str, categories: Sequence[Any] | None, weighting: str | None) -> dict[str, Any]:
    annotators = sorted({a for answers in table.values() for a in answers})
    pairwise = []
    for first, second in itertools.combinations(annotators, 2):
        pairs = [
            (answers[first], answers[second]) for answers in table.values() if first in answers and second in answers
        ]
        if pairs:
            pairwise.append(
                {
                    "annotators": [first, second],
                    "items": len(pairs),
                    "kappa": cohen_kappa(pairs, categories=categories, weighting=weighting),
                }
            )
    return {
        "items": sum(1 for answers in table.values() if len(answers) >= 2),
        "alpha": krippendorff_alpha((list(answers.values()) for answers in table.values()), metric),
        "kappa": pairwise[0]["kappa"] if len(annotators) == 2 and pairwise else None,
        "pairwise_kappa": pairwise,
    }


def question_agreement(question: dict[str, Any], rows: Sequence[Answered]) -> dict[str, Any] | None:
    """Agreement on one question (None for comments)."""
    kind = question["kind"]
    head = {"key": question["key"], "kind": kind, "label": question["label"]}
    if kind in ("pass_fail", "pairwise"):
        return {
            **head,
            "metric": "nominal",
            "kappa_weighting": None,
            **_measures(_table(rows, question["key"]), "nominal", None, None),
        }
    if kind == "rating":
        scale = list(range(question["min"], question["max"] + 1))
        return {
            **head,
            "metric": "interval",
            "kappa_weighting": "quadratic",
            **_measures(_table(rows, question["key"]), "interval", scale, "quadratic"),
        }
    if kind == "steps":
        return {
            **head,
            "metric": "nominal",
            "kappa_weighting": None,
            **_measures(_table(rows, question["key"], _first_wrong), "nominal", None, None),
        }
    if kind == "tags":
        per_tag = {
            tag: _measures(
                _table(rows, question["key"], lambda chosen, tag=tag: tag in chosen), "nominal", [False, True], None
            )
            for tag in question["options"]
        }
        return {**head, "metric": "nominal per tag", "kappa_weighting": None, "per_tag": per_tag}
    return None


def _first_wrong(answer: dict[str, Any]) -> int:
    first = answer.get("first_wrong") if isinstance(answer, dict) else None
    return NO_WRONG_STEP if first is None else first


def _plurality(values: Iterable[Any]) -> Any:
    """The most frequent value when one value is strictly the most frequent, else None."""
    ranked = Counter(values).most_common(2)
    if not ranked or (len(ranked) == 2 and ranked[0][1] == ranked[1][1]):
        return None
    return ranked[0][0]


def _with_majority(table: Table, annotator: str) -> dict[str, Any]:
    agreed = compared = 0
    for answers in table.values():
        if annotator not in answers:
            continue
        majority = _plurality(v for a, v in answers.items() if a != annotator)
        if majority is None:
            continue  # nobody else answered, or the others split evenly
        compared += 1
        agreed += answers[annotator] == majority
    return {"rate": agreed / compared if compared else None, "items": compared}


def _rating_gap(table: Table, annotator: str) -> dict[str, Any]:
    gaps = []
    for answers in table.values():
        others = [v for a, v in answers.items() if a != annotator]
        if annotator in answers and others:
            gaps.append(abs(answers[annotator] - fmean(others)))
    return {"value": fmean(gaps) if gaps else None, "items": len(gaps)}


def annotator_stats(questions: Sequence[dict[str, Any]], rows: Sequence[Answered]) -> list[dict[str, Any]]:
    """Per annotator: items judged, mean seconds, and per question their answers' summary and how often
    they agree with the other annotators' plurality (pass/fail, pairwise; items where the others split
    evenly are left out) or how far their rating is from the others' mean rating."""
    by_annotator: dict[str, list[Answered]] = defaultdict(list)
    for row in rows:
        by_annotator[row.annotator].append(row)
    tables = {q["key"]: _table(rows, q["key"]) for q in questions}
    stats = []
    for annotator in sorted(by_annotator):
        mine = by_annotator[annotator]
        per_question: dict[str, Any] = {}
        for question in questions:
            key, kind = question["key"], question["kind"]
            values = [row.answers[key] for row in mine if row.answers.get(key) is not None]
            entry: dict[str, Any] = {"answered": len(values)}
            if kind == "pass_fail":
                entry["pass_rate"] = sum(values) / len(values) if values else None
                entry["agreement_with_majority"] = _with_majority(tables[key], annotator)
            elif kind == "pairwise":
                counts = Counter(values)
                entry["choices"] = {choice: counts.get(choice, 0) for choice in question["choices"]}
                entry["agreement_with_majority"] = _with_majority(tables[key], annotator)
            elif kind == "rating":
                entry["mean"] = fmean(values) if values else None
                entry["mean_abs_diff_from_others"] = _rating_gap(tables[key], annotator)
            elif kind == "tags":
                entry["tag_rates"] = {
                    tag: (sum(tag in v for v in values) / len(values) if values else None)
                    for tag in question["options"]
                }
            per_question[key] = entry
        stats.append(
            {
                "annotator": annotator,
                "items_judged": len(mine),
                "mean_seconds": fmean(row.seconds for row in mine),
                "questions": per_question,
            }
        )
    return stats


def campaign_agreement(questions: Sequence[dict[str, Any]], rows: Sequence[Answered]) -> dict[str, Any]:
    return {
        "annotators": sorted({row.annotator for row in rows}),
        "judgements": len(rows),
        "questions": [q for q in (question_agreement(question, rows) for question in questions) if q is not None],
        "annotator_stats": annotator_stats(questions, rows),
    }


# --- a judge against the humans -----------------------------------------------------------------


def _rates(pairs: Sequence[tuple[bool, bool]]) -> dict[str, Any]:
    """(human positive, judge positive) pairs -> TPR, FPR, TNR, FNR and the counts (None where undefined)."""
    tp = sum(h and j for h, j in pairs)
    fn = sum(h and not j for h, j in pairs)
    fp = sum(j and not h for h, j in pairs)
    tn = sum(not h and not j for h, j in pairs)
    positives, negatives = tp + fn, fp + tn
    return {
        "tp": tp,
        "fn": fn,
        "fp": fp,
        "tn": tn,
        "tpr": tp / positives if positives else None,
        "fnr": fn / positives if positives else None,
        "fpr": fp / negatives if negatives else None,
        "tnr": tn / negatives if negatives else None,
    }


def judge_question_agreement(question: dict[str, Any], pairs: dict[int, tuple[Any, Any]]) -> dict[str, Any] | None:
    """One question: `pairs` is item -> (human label, judge answer), ratings as points of the scale."""
    kind = question["kind"]
    if kind not in ("pass_fail", "rating", "pairwise"):
        return None
    items = sorted(pairs)
    values = [pairs[i] for i in items]
    if kind == "rating":
        scale = list(range(question["min"], question["max"] + 1))
        kappa = cohen_kappa(values, categories=scale, weighting="quadratic") if values else None
        middle = (question["min"] + question["max"]) / 2
        rates: dict[str, Any] = _rates([(h > middle, j > middle) for h, j in values])
    else:
        kappa = cohen_kappa(values) if values else None
        if kind == "pass_fail":
            rates = _rates([(bool(h), bool(j)) for h, j in values])
        else:
            rates = {side: _rates([(h == side, j == side) for h, j in values]) for side in ("A", "B")}
    confusion = Counter(values)
    return {
        "key": question["key"],
        "kind": kind,
        "label": question["label"],
        "items": len(values),
        "agreement": sum(h == j for h, j in values) / len(values) if values else None,
        "kappa": kappa,
        "kappa_weighting": "quadratic" if kind == "rating" else None,
        "rates": rates,
        "confusion": [
            {"human": h, "judge": j, "items": n}
            for (h, j), n in sorted(confusion.items(), key=lambda hjn: (repr(hjn[0][0]), repr(hjn[0][1])))
        ],
        "wrong": [item for item in items if pairs[item][0] != pairs[item][1]],
    }
