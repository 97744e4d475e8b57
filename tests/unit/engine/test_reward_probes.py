"""Reward probes: the adversarial answers built from a dataset, and the hackability report; each probe
against a planted reward it is there to catch, and an honest reward none of them games."""

from __future__ import annotations

import re

import pytest

from rl_engine.reward_probes import HONEST, PROBES, ProbeCase, build_cases, hackability_report

ROWS = [
    (f"What is {a} + {b}?", str(a + b), {"id": i}) for i, (a, b) in enumerate([(12, 30), (7, 8), (40, 2), (33, 33)])
]


def by_probe(cases: list[ProbeCase], row: int) -> dict[str, str]:
    return {case.probe: case.response for case in cases if case.row == row}


def test_every_probed_row_gets_the_honest_answer_and_one_answer_per_probe():
    cases = build_cases(ROWS, seed=0, rows_probed=3)
    rows = sorted({case.row for case in cases})
    assert len(rows) == 3
    for row in rows:
        answers = by_probe(cases, row)
        assert list(answers) == [HONEST, *PROBES]
        prompt, label, metadata = ROWS[row]
        assert answers[HONEST] == label and answers["empty"] == "" and answers["prompt_echo"] == prompt
        assert set(answers["all_labels"].splitlines()) == {label for _, label, _ in ROWS}
        assert f" {label} " in answers["label_in_garbage"] and len(answers["label_in_garbage"]) > 400
        wrong = answers["right_format_wrong_answer"]
        assert len(wrong) == len(label) and wrong.isdigit() and all(a != b for a, b in zip(wrong, label))
        assert label not in answers["very_long"] and len(answers["very_long"]) > 3000
        assert answers["repeated_tokens"] == " ".join(["answer"] * 300)
        assert answers["other_label"] in {other for _, other, _ in ROWS} - {label}
        assert all(case.label == label and case.metadata == metadata for case in cases if case.row == row)


def test_the_wrong_answer_keeps_the_labels_shape():
    rows = [("q", r"\boxed{Ab-12}", {}), ("r", "Paris", {})]
    cases = build_cases(rows, rows_probed=2)
    numeric, word = by_probe(cases, 0)["right_format_wrong_answer"], by_probe(cases, 1)["right_format_wrong_answer"]
    # digits changed, the markup and letters kept; a label without digits gets its letters changed
    assert re.fullmatch(r"\\boxed\{Ab-\d\d\}", numeric) and numeric[-3] != "1" and numeric[-2] != "2"
    assert re.fullmatch(r"[A-Z][a-z]{4}", word) and all(a != b for a, b in zip(word, "Paris"))


def test_cases_are_the_same_for_the_same_seed_and_need_a_label():
    assert build_cases(ROWS, seed=1) == build_cases(ROWS, seed=1)
    with pytest.raises(ValueError, match="no row of the dataset has a label"):
        build_cases([("q", None, {}), ("r", "", {})])


def score_with(reward, cases: list[ProbeCase]) -> dict:
    scores = [reward(case.prompt, case.response, case.label) for case in cases]
    return hackability_report(cases, scores, [[] for _ in cases])


def flagged(report: dict) -> set[str]:
    return {p["probe"] for p in report["probes"] if p["flagged"]}


# Planted rewards, each gameable by the probe that names it (and an honest one none should game).
PLANTED = {
    "empty": lambda prompt, response, label: 1.0 if len(response) < 200 else 0.0,  # pays short answers
    # a judge that pays the right answer, and restating the question nearly as much
    "prompt_echo": lambda prompt, response, label: max(
        float(response == label), len(set(prompt.split()) & set(response.split())) / 4
    ),
    "all_labels": lambda prompt, response, label: float(label in response),  # the label anywhere
    "label_in_garbage": lambda prompt, response, label: float(label in response),
    "right_format_wrong_answer": lambda prompt, response, label: float(bool(re.fullmatch(r"\d+", response))),
    "very_long": lambda prompt, response, label: min(len(response) / 1000, 1.0),  # length-scaled
    "repeated_tokens": lambda prompt, response, label: min(len(response.split()) / 100, 1.0),  # words counted
    "other_label": lambda prompt, response, label: float(response.strip().isdigit()),  # any number
}


@pytest.mark.parametrize("probe", PROBES)
def test_each_probe_flags_the_planted_reward_it_is_there_to_catch(probe):
    report = score_with(PLANTED[probe], build_cases(ROWS, seed=0))
    assert probe in flagged(report) and report["hackable"]
    fraction = next(p["fraction"] for p in report["probes"] if p["probe"] == probe)
    assert fraction >= 0.5


def test_an_exact_match_reward_is_gamed_by_no_probe():
    report = score_with(lambda prompt, response, label: float(response.strip() == label), build_cases(ROWS))
    assert flagged(report) == set() and not report["hackable"]
    assert report["honest_mean"] == 1.0 and report["rows"] == 4
    assert all(p["mean"] == 0.0 and p["fraction"] == 0.0 for p in report["probes"])


def test_the_report_holds_each_probes_mean_its_fraction_of_honest_and_the_failures():
    cases = [
        ProbeCase(HONEST, 0, "q", "4", "4", {}),
        ProbeCase(HONEST, 1, "q", "5", "5", {}),
        ProbeCase("empty", 0, "q", "", "4", {}),
        ProbeCase("empty", 1, "q", "", "5", {}),
        ProbeCase("other_label", 0, "q", "5", "4", {}),
        ProbeCase("other_label", 1, "q", "4", "5", {}),
    ]
    # honest 0.8 on average; empty 0.2 (25%); other_label 0.4 (50%: flagged); one failed sample
    report = hackability_report(cases, [0.8, 0.8, 0.4, 0.0, 0.4, 0.4], [[], [], [], ["boom"], [], []])
    assert report["honest_mean"] == pytest.approx(0.8)
    assert report["probes"] == [
        {"probe": "empty", "mean": pytest.approx(0.2), "fraction": pytest.approx(0.25), "flagged": False, "errors": 1},
        {
            "probe": "other_label",
            "mean": pytest.approx(0.4),
            "fraction": pytest.approx(0.5),
            "flagged": True,
            "errors": 0,
        },
    ]
    assert report["worst"] == "other_label" and report["hackable"] and report["note"] is None


def test_a_reward_that_pays_the_honest_answer_nothing_cannot_be_judged():
    cases = [ProbeCase(HONEST, 0, "q", "4", "4", {}), ProbeCase("empty", 0, "q", "", "4", {})]
    report = hackability_report(cases, [0.0, 0.5], [[], []])
    assert report["probes"][0]["fraction"] is None and not report["hackable"] and report["worst"] is None
    assert "score nothing" in report["note"]
