"""Step-level labels: the sentence split annotators see, marking the first wrong step (by sentence or by a
token range in the per-token view), and the PRM800K-style export, registered as a dataset, read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.core.errors import InvalidInput
from posttrain.registry.models import Dataset
from posttrain.review import selectors
from posttrain.review import services as review
from posttrain.review.export import campaign_export_register, export_campaign
from posttrain.review.steps import check_step_answer, prm_record, split_steps
from tests.unit.platform.helpers import default_project, run_with_samples, sample, single_campaign

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]

STEPS_QUESTION = [{"key": "first_error", "kind": "steps", "label": "Where does it first go wrong?"}]
TOKEN_QUESTION = [{"key": "first_error", "kind": "steps", "label": "Where does it first go wrong?", "unit": "token"}]
SOLUTION = "We add 2 and 3.  That gives 6!\nSo the answer is 6.5 or so? Done"


# --- the split rule -----------------------------------------------------------------------------


def test_a_response_splits_at_line_breaks_and_at_sentence_ends_followed_by_whitespace():
    steps = split_steps(SOLUTION)
    assert steps.texts == ["We add 2 and 3.", "That gives 6!", "So the answer is 6.5 or so?", "Done"]
    assert steps.starts == [0, 17, 31, 59]
    assert [SOLUTION[start : start + len(text)] for start, text in zip(steps.starts, steps.texts)] == steps.texts


def test_blank_lines_and_surrounding_whitespace_make_no_steps():
    assert split_steps("  \n\n one.   two \n\t\n").texts == ["one.", "two"]
    assert split_steps("").texts == []


def test_a_token_range_is_stored_with_the_step_its_first_token_is_in():
    tokens = {"text": ["We", " add", " 2", " and", " 3", ".", "  That", " gives", " 6", "!"]}
    steps = split_steps("We add 2 and 3.  That gives 6!", tokens)
    question = TOKEN_QUESTION[0]
    # Tokens 7..8 (" gives", " 6"): their first visible character, "g" at 22, is in the second step.
    assert check_step_answer(question, {"tokens": [7, 9]}, steps, "answers.first_error") == {
        "first_wrong": 1,
        "tokens": [7, 9],
    }
    # "  That" starts on the whitespace between the steps; its "T" is the second step's first character.
    assert check_step_answer(question, {"tokens": [6, 7]}, steps, "a")["first_wrong"] == 1
    assert check_step_answer(question, {"tokens": [5, 6]}, steps, "a")["first_wrong"] == 0  # the "."
    with pytest.raises(InvalidInput) as refused:
        check_step_answer(question, {"tokens": [3, 11]}, steps, "answers.first_error")
    assert refused.value.errors == [
        {"loc": "answers.first_error.tokens", "msg": "must be [start, end] with 0 ≤ start < end ≤ 10 (tokens)"}
    ]


def test_a_step_index_outside_the_response_is_refused_naming_the_field():
    with pytest.raises(InvalidInput) as refused:
        check_step_answer(STEPS_QUESTION[0], {"first_wrong": 4}, split_steps(SOLUTION), "answers.first_error")
    assert refused.value.errors == [
        {
            "loc": "answers.first_error.first_wrong",
            "msg": "must be a step from 0 to 3, or null when no step is wrong",
        }
    ]


def test_the_prm_record_keeps_the_steps_up_to_the_first_wrong_one():
    steps = split_steps(SOLUTION)
    assert prm_record("2+3=", steps, 1) == {
        "prompt": "2+3=",
        "steps": ["We add 2 and 3.", "That gives 6!"],
        "labels": [1, -1],
    }
    assert prm_record("2+3=", steps, None)["labels"] == [1, 1, 1, 1]


# --- through the campaign ------------------------------------------------------------------------


@pytest.fixture
def people(make_user):
    return make_user("annotator", "ann"), make_user("annotator", "bob")


@pytest.fixture
def run(experiment):
    return run_with_samples(
        experiment,
        {
            1: [
                sample(0, 0.0, "2+3=", SOLUTION),
                sample(1, 1.0, "1+1=", "One and one. Makes 2."),
                sample(
                    2,
                    1.0,
                    "4+4=",
                    "It is 8. Sure.",
                    tokens={"text": ["It", " is", " 8", ".", " Sure", "."]},
                ),
            ]
        },
        name="r",
    )


def _item(campaign, prompt):
    return campaign.items.select_related("rollout_a", "campaign").get(rollout_a__prompt=prompt)


def test_annotators_see_the_steps_and_their_marks_are_stored_by_step(run, people):
    ann, _ = people
    campaign = single_campaign([run], [ann], k=3, questions=STEPS_QUESTION)
    item = _item(campaign, "2+3=")
    shown = selectors.item_for_annotator(item, ann)["responses"][0]["steps"]
    assert shown == {
        "texts": ["We add 2 and 3.", "That gives 6!", "So the answer is 6.5 or so?", "Done"],
        "starts": [0, 17, 31, 59],
        "unit": "sentence",
        "tokens": None,
    }
    review.judgement_submit(item, ann, {"first_error": {"first_wrong": 1}})
    with pytest.raises(InvalidInput) as refused:
        review.judgement_submit(_item(campaign, "1+1="), ann, {"first_error": {"first_wrong": 2}})
    assert refused.value.errors[0]["loc"] == "answers.first_error.first_wrong"


def test_a_token_question_shows_tokens_where_the_rollout_has_a_per_token_view_and_sentences_elsewhere(run, people):
    ann, _ = people
    campaign = single_campaign([run], [ann], k=3, questions=TOKEN_QUESTION)
    with_tokens = selectors.item_for_annotator(_item(campaign, "4+4="), ann)["responses"][0]["steps"]
    assert with_tokens["unit"] == "token" and with_tokens["tokens"] == ["It", " is", " 8", ".", " Sure", "."]
    without = selectors.item_for_annotator(_item(campaign, "1+1="), ann)["responses"][0]["steps"]
    assert without["unit"] == "sentence" and without["tokens"] is None
    judgement, _ = review.judgement_submit(_item(campaign, "4+4="), ann, {"first_error": {"tokens": [4, 6]}})
    assert judgement.answers == {"first_error": {"first_wrong": 1, "tokens": [4, 6]}}


def test_the_step_labels_export_round_trips_through_the_registry(run, people, storage):
    ann, bob = people
    campaign = single_campaign([run], [ann, bob], k=3, overlap=2, questions=STEPS_QUESTION)
    marks = {"2+3=": (1, 1), "1+1=": (None, None), "4+4=": (0, 1)}  # the last one: ann and bob disagree
    for prompt, (first, second) in marks.items():
        item = _item(campaign, prompt)
        review.judgement_submit(item, ann, {"first_error": {"first_wrong": first}})
        review.judgement_submit(item, bob, {"first_error": {"first_wrong": second}})
    expected = [
        {"prompt": "2+3=", "steps": ["We add 2 and 3.", "That gives 6!"], "labels": [1, -1]},
        {"prompt": "1+1=", "steps": ["One and one.", "Makes 2."], "labels": [1, 1]},
    ]
    by_prompt = {r["prompt"]: r for r in map(json.loads, export_campaign(campaign, "prm").lines)}
    assert sorted(by_prompt) == ["1+1=", "2+3="]  # split votes give no label
    assert [by_prompt[r["prompt"]] for r in expected] == expected

    dataset, created = campaign_export_register(campaign, "prm", "first errors", ann, project=default_project())
    assert created and dataset.row_count == 2 and dataset.source_campaign_id == campaign.pk
    stored = [json.loads(line) for line in Path(dataset.path).read_text().splitlines()]
    assert sorted(stored, key=lambda r: r["prompt"]) == sorted(expected, key=lambda r: r["prompt"])
    assert Dataset.objects.get(pk=dataset.pk).columns == ["prompt", "steps", "labels"]


def test_prm_export_of_a_campaign_without_a_steps_question_is_refused(run, people):
    campaign = single_campaign([run], [people[0]], k=1)
    with pytest.raises(InvalidInput) as refused:
        export_campaign(campaign, "prm")
    assert refused.value.errors[0]["loc"] == "format"
    assert "steps question" in refused.value.errors[0]["msg"]
