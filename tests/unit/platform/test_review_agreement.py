"""Agreement math against values computed by hand (the working is in each test's docstring)."""

from __future__ import annotations

import pytest

from posttrain.review.agreement import (
    Answered,
    annotator_stats,
    cohen_kappa,
    krippendorff_alpha,
    question_agreement,
)

# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: 4 observers, 12 units,
# values 1..5, None = missing. Unit 12 has a single value and pairs with nothing.
KRIPPENDORFF_TABLE = {
    "A": [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
    "B": [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
    "C": [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
    "D": [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
}


def _units(table: dict[str, list]) -> list[list]:
    columns = zip(*table.values())
    return [[v for v in column if v is not None] for column in columns]


def test_krippendorff_alpha_nominal_matches_the_textbook_example():
    """Pairable values n = 40 (units 1..11: 3+4·8+3+2). Value counts n_c: 1→9, 2→13, 3→10, 4→5, 5→3.

    Observed disagreement Σ o_ck (c ≠ k): unit 2 (2,2,3,2): 6 ordered unlike pairs / (4 − 1) = 2;
    unit 6 (1,2,3,4): 12 / 3 = 4; unit 8 (1,1,2,1): 6 / 3 = 2; all other units agree. Total 8.
    Expected Σ n_c n_k (c ≠ k) = 40² − (81 + 169 + 100 + 25 + 9) = 1600 − 384 = 1216.
    alpha = 1 − (40 − 1) · 8 / 1216 = 1 − 312/1216 = 113/152 ≈ 0.743 (the paper's value)."""
    assert krippendorff_alpha(_units(KRIPPENDORFF_TABLE), "nominal") == pytest.approx(113 / 152, abs=1e-9)


def test_krippendorff_alpha_interval_matches_the_textbook_example():
    """Observed Σ o_ck (c − k)²: unit 2: 6 pairs of (2,3) · 1 / 3 = 2; unit 6: unordered pair distances
    1+4+9+1+4+1 = 20, ordered 40, / 3 = 40/3; unit 8: 6 · 1 / 3 = 2. Total 52/3.
    Expected Σ n_c n_k (c − k)², ordered pairs = 2 · (9·13·1 + 9·10·4 + 9·5·9 + 9·3·16 + 13·10·1 + 13·5·4
    + 13·3·9 + 10·5·1 + 10·3·4 + 5·3·1) = 2 · 2240 = 4480.
    alpha = 1 − 39 · (52/3) / 4480 = 1 − 676/4480 = 951/1120 ≈ 0.849 (the paper's value)."""
    assert krippendorff_alpha(_units(KRIPPENDORFF_TABLE), "interval") == pytest.approx(951 / 1120, abs=1e-9)


def test_krippendorff_alpha_is_one_for_perfect_agreement_and_undefined_without_variation():
    assert krippendorff_alpha([[1, 1], [2, 2, 2], [1, 1]], "nominal") == pytest.approx(1.0, abs=1e-12)
    assert krippendorff_alpha([[True, True], [True, True]], "nominal") is None  # no expected disagreement
    assert krippendorff_alpha([[1], [2]], "nominal") is None  # nothing pairable


def test_cohen_kappa_nominal_matches_the_hand_computed_value():
    """50 items: both yes 20, A yes/B no 5, A no/B yes 10, both no 15.
    p_o = (20 + 15)/50 = 0.7; A says yes 25/50, B says yes 30/50;
    p_e = 0.5·0.6 + 0.5·0.4 = 0.5; kappa = (0.7 − 0.5)/(1 − 0.5) = 0.4."""
    pairs = [("yes", "yes")] * 20 + [("yes", "no")] * 5 + [("no", "yes")] * 10 + [("no", "no")] * 15
    assert cohen_kappa(pairs) == pytest.approx(0.4, abs=1e-9)


WEIGHTED_PAIRS = [(1, 1), (2, 3), (3, 3), (1, 2), (3, 3)]  # scale 1..3, five items


def test_cohen_kappa_quadratic_weighted_matches_the_hand_computed_value():
    """Weights (i − j)²/(3 − 1)²: 0, 1/4 for neighbours, 1 for 1-vs-3.
    Observed mean weight: (1/4 + 1/4)/5 = 0.1.
    Marginals A: 1→.4, 2→.2, 3→.4; B: 1→.2, 2→.2, 3→.6. Expected mean weight:
    .4·(.2·¼ + .6·1) + .2·(.2·¼ + .6·¼) + .4·(.2·1 + .2·¼) = .26 + .04 + .10 = 0.4.
    kappa = 1 − 0.1/0.4 = 0.75."""
    assert cohen_kappa(WEIGHTED_PAIRS, categories=[1, 2, 3], weighting="quadratic") == pytest.approx(0.75, abs=1e-9)


def test_cohen_kappa_linear_weighted_matches_the_hand_computed_value():
    """Weights |i − j|/2. Observed: (½ + ½)/5 = 0.2. Expected:
    .4·(.2·½ + .6·1) + .2·(.2·½ + .6·½) + .4·(.2·1 + .2·½) = .28 + .08 + .12 = 0.48.
    kappa = 1 − 0.2/0.48 = 7/12."""
    assert cohen_kappa(WEIGHTED_PAIRS, categories=[1, 2, 3], weighting="linear") == pytest.approx(7 / 12, abs=1e-9)


def test_cohen_kappa_is_undefined_when_both_raters_never_vary():
    assert cohen_kappa([(True, True), (True, True)]) is None
    assert cohen_kappa([]) is None


PASS_QUESTION = {"key": "ok", "kind": "pass_fail", "label": "OK?", "required": True}


def _rows(question: str, table: dict[str, list]) -> list[Answered]:
    return [
        Answered(item=i, annotator=name, answers={question: value}, seconds=10.0)
        for name, values in table.items()
        for i, value in enumerate(values)
        if value is not None
    ]


def test_pass_fail_question_gets_kappa_and_alpha_of_its_two_annotators():
    """Items: (T,T), (T,F), (F,F), (F,F).
    kappa: p_o = 3/4; ann1 passes 1/2, ann2 1/4; p_e = .5·.25 + .5·.75 = .5; kappa = (.75 − .5)/.5 = 0.5.
    alpha: n = 8 values, n_T = 3, n_F = 5; unit 2 adds o_TF = o_FT = 1/(2 − 1) = 1, so Σ o (unlike) = 2;
    Σ n_c n_k (unlike) = 2·3·5 = 30; alpha = 1 − 7·2/30 = 16/30."""
    rows = _rows("ok", {"ann1": [True, True, False, False], "ann2": [True, False, False, False]})
    result = question_agreement(PASS_QUESTION, rows)
    assert result["metric"] == "nominal"
    assert result["items"] == 4
    assert result["kappa"] == pytest.approx(0.5, abs=1e-9)
    assert result["alpha"] == pytest.approx(16 / 30, abs=1e-9)
    assert result["pairwise_kappa"] == [{"annotators": ["ann1", "ann2"], "items": 4, "kappa": pytest.approx(0.5)}]


def test_rating_question_uses_interval_alpha_and_quadratic_kappa():
    question = {"key": "q", "kind": "rating", "label": "Quality", "required": True, "min": 1, "max": 3, "labels": []}
    first, second = zip(*WEIGHTED_PAIRS)
    result = question_agreement(question, _rows("q", {"a": list(first), "b": list(second)}))
    assert (result["metric"], result["kappa_weighting"]) == ("interval", "quadratic")
    assert result["kappa"] == pytest.approx(0.75, abs=1e-9)
    assert result["alpha"] == pytest.approx(
        krippendorff_alpha([list(p) for p in WEIGHTED_PAIRS], "interval"), abs=1e-12
    )


def test_tags_are_judged_one_tag_at_a_time_as_yes_or_no():
    """Tag "rude" over 4 items: a = (yes, yes, no, no), b = (yes, no, no, no) — the pass/fail table above,
    so kappa 0.5 and alpha 16/30. Tag "wrong" is never picked: no variation, undefined."""
    question = {"key": "t", "kind": "tags", "label": "Issues", "required": False, "options": ["rude", "wrong"]}
    rows = _rows("t", {"a": [["rude"], ["rude"], [], []], "b": [["rude"], [], [], []]})
    per_tag = question_agreement(question, rows)["per_tag"]
    assert per_tag["rude"]["kappa"] == pytest.approx(0.5, abs=1e-9)
    assert per_tag["rude"]["alpha"] == pytest.approx(16 / 30, abs=1e-9)
    assert per_tag["wrong"]["kappa"] is None and per_tag["wrong"]["alpha"] is None


def test_kappa_is_given_only_for_exactly_two_annotators_but_alpha_for_any_number():
    rows = _rows("ok", {"a": [True, False, True], "b": [True, False, False], "c": [True, True, True]})
    result = question_agreement(PASS_QUESTION, rows)
    assert result["kappa"] is None
    assert [p["annotators"] for p in result["pairwise_kappa"]] == [["a", "b"], ["a", "c"], ["b", "c"]]
    assert result["alpha"] is not None


def test_comments_have_no_agreement():
    assert question_agreement({"key": "c", "kind": "comment", "label": "Note", "required": False}, []) is None


def test_annotator_stats_count_agreement_with_the_others_majority():
    """Item 0: a=T, b=T, c=F → a agrees with {T,T}? others of a are b=T, c=F: level, not counted.
    Item 1: a=T, b=F, c=F → others of a: F,F → majority F, a disagrees; b: others T,F level; c: others T,F level.
    Item 2: a=F, b=F, c=F → everyone agrees with the others.
    a: compared items 1, 2 → 1 of 2. b: item 0 (others T,F level) no; item 2 yes → 1 of 1."""
    rows = _rows("ok", {"a": [True, True, False], "b": [True, False, False], "c": [False, False, False]})
    stats = {s["annotator"]: s for s in annotator_stats([PASS_QUESTION], rows)}
    assert stats["a"]["questions"]["ok"]["agreement_with_majority"] == {"rate": 0.5, "items": 2}
    assert stats["b"]["questions"]["ok"]["agreement_with_majority"] == {"rate": 1.0, "items": 1}
    assert stats["a"]["questions"]["ok"]["pass_rate"] == pytest.approx(2 / 3)
    assert stats["c"]["items_judged"] == 3 and stats["c"]["mean_seconds"] == 10.0


def test_annotator_stats_measure_rating_distance_from_the_others_mean():
    """Item 0: a=1, b=3, c=2 → a is |1 − 2.5| = 1.5 from the others' mean; item 1: a=3, b=3 → 0. Mean 0.75."""
    question = {"key": "q", "kind": "rating", "label": "Quality", "required": True, "min": 1, "max": 3, "labels": []}
    rows = _rows("q", {"a": [1, 3], "b": [3, 3], "c": [2, None]})
    stats = {s["annotator"]: s for s in annotator_stats([question], rows)}
    assert stats["a"]["questions"]["q"]["mean_abs_diff_from_others"] == {"value": 0.75, "items": 2}
    assert stats["a"]["questions"]["q"]["mean"] == 2.0
