"""Gold items: known answers from a dataset's labels or set by the campaign's owner, mixed in unmarked;
each annotator's accuracy on them, and their judgements weighted or set aside by it in the labels and the
exports. The figures are checked against hand-made judgements."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from posttrain.core.errors import InvalidInput
from posttrain.registry.models import Dataset
from posttrain.review import selectors
from posttrain.review import services as review
from posttrain.review.agreement import Answered
from posttrain.review.export import export_campaign, preference_pairs
from posttrain.review.labels import GOLD_POLICY_DEFAULTS, gold_checks, item_labels, validate_gold_policy
from posttrain.review.models import GoldSource, ReviewState
from tests.unit.platform.helpers import PASS_FAIL, pair_campaign, run_with_samples, sample, shown_as, single_campaign

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]

QUESTIONS = [
    {"key": "correct", "kind": "pass_fail", "label": "Correct?", "required": True},
    {"key": "stars", "kind": "rating", "label": "Stars", "min": 1, "max": 5, "required": True},
    {"key": "note", "kind": "comment", "label": "Note", "required": False},
]
PREFERENCE_AND_NOTE = [
    {"key": "better", "kind": "pairwise", "label": "Better?"},
    {"key": "note", "kind": "comment", "label": "Why?"},
]
# Four gold items (10..13) and one ordinary item (20). Known answers:
GOLD = {
    10: {"correct": True, "stars": 5},
    11: {"correct": False},
    12: {"correct": True},
    13: {"correct": False, "stars": 1},
}
# ann: every gold answer right (6 of 6). bob: correct right on 10 and 11 only, stars off by one on 10 and
# right on 13: 3 of 6. cat judged only items 10 and 20: correct wrong, stars right: 1 of 2.
ROWS = [
    Answered(10, "ann", {"correct": True, "stars": 5}),
    Answered(11, "ann", {"correct": False, "stars": 2}),
    Answered(12, "ann", {"correct": True, "stars": 4}),
    Answered(13, "ann", {"correct": False, "stars": 1}),
    Answered(20, "ann", {"correct": True, "stars": 4}),
    Answered(10, "bob", {"correct": True, "stars": 4}),
    Answered(11, "bob", {"correct": False, "stars": 3}),
    Answered(12, "bob", {"correct": False, "stars": 3}),
    Answered(13, "bob", {"correct": True, "stars": 1}),
    Answered(20, "bob", {"correct": False, "stars": 2}),
    Answered(10, "cat", {"correct": False, "stars": 5, "note": "hm"}),
    Answered(20, "cat", {"correct": False, "stars": 3}),
]


def checks(**policy):
    return gold_checks(QUESTIONS, GOLD, ROWS, {**GOLD_POLICY_DEFAULTS, **policy})


def test_gold_accuracy_counts_each_known_answer_an_annotator_gave():
    found = checks()
    assert {a: (c.answered, c.correct, c.accuracy) for a, c in found.items()} == {
        "ann": (6, 6, 1.0),
        "bob": (6, 3, 0.5),
        "cat": (2, 1, 0.5),
    }
    # Below min_items (3) the accuracy does not count: cat keeps weight 1 whatever it is.
    assert {a: (c.counted, c.weight) for a, c in found.items()} == {
        "ann": (True, 1.0),
        "bob": (True, 1.0),
        "cat": (False, 1.0),
    }


def test_annotators_below_the_minimum_accuracy_are_set_aside_and_the_others_weighted_by_it():
    found = checks(min_accuracy=0.6, weighting="accuracy")
    assert {a: (c.set_aside, c.weight) for a, c in found.items()} == {
        "ann": (False, 1.0),
        "bob": (True, 0.0),
        "cat": (False, 1.0),  # 2 gold answers: not enough to judge, kept at full weight
    }
    weighted = checks(min_items=2, weighting="accuracy")
    assert {a: c.weight for a, c in weighted.items()} == {"ann": 1.0, "bob": 0.5, "cat": 0.5}


def test_weights_decide_an_items_label():
    on_20 = [row for row in ROWS if row.item == 20]  # ann: pass 4; bob: fail 2; cat: fail 3
    equal = item_labels(QUESTIONS, on_20, {"ann": 1.0, "bob": 1.0, "cat": 1.0})
    assert (equal["correct"].value, equal["stars"].value) == (False, 3.0)
    # Accuracy weights (min_items 2): fail weighs 0.5 + 0.5 = pass's 1.0, a tie: no label; stars 4·1 + 2·.5 + 3·.5 / 2.
    by_accuracy = item_labels(QUESTIONS, on_20, {"ann": 1.0, "bob": 0.5, "cat": 0.5})
    assert "correct" not in by_accuracy
    assert by_accuracy["stars"].value == pytest.approx((4 * 1.0 + 2 * 0.5 + 3 * 0.5) / 2.0)
    # bob set aside: ann's pass against cat's fail is level too; a gold answer always wins.
    assert item_labels(QUESTIONS, on_20, {"bob": 0.0}, gold={"correct": True})["correct"].source == "gold"


def test_a_gold_policy_names_each_bad_field():
    with pytest.raises(InvalidInput) as refused:
        validate_gold_policy({"min_items": 0, "min_accuracy": 1.5, "weighting": "vibes", "extra": 1})
    assert {e["loc"] for e in refused.value.errors} == {
        "gold_policy.extra",
        "gold_policy.min_items",
        "gold_policy.min_accuracy",
        "gold_policy.weighting",
    }


# --- gold set by the owner, through the services --------------------------------------------------


@pytest.fixture
def annotators(make_user):
    return [make_user("annotator", name) for name in ("ann", "bob", "cat")]


@pytest.fixture
def pair_run(experiment):
    groups = [("1+1=", "2", "3"), ("2+2=", "4", "5"), ("3+3=", "6", "7"), ("4+4=", "8", "9")]
    samples = [
        sample(2 * g + j, 1.0 - j, prompt, response, group=g)
        for g, (prompt, *responses) in enumerate(groups)
        for j, response in enumerate(responses)
    ]
    return run_with_samples(experiment, {1: samples}, name="pairs")


def _right(item):
    """The stored answer naming the correct response (the one whose text is the sum)."""
    return "A" if int(item.rollout_a.response) % 2 == 0 else "B"


def test_the_owner_marks_gold_and_a_careless_annotator_is_set_aside_in_the_preference_export(pair_run, annotators):
    ann, bob, cat = annotators
    campaign = pair_campaign([pair_run], annotators, overlap=3, k=4)
    items = list(campaign.items.select_related("rollout_a", "rollout_b", "campaign").order_by("position"))
    gold, data = items[:3], items[3]
    for item in gold:
        review.item_gold_set(item, {"better": _right(item)})
    review.campaign_update(campaign, gold_policy={"min_items": 3, "min_accuracy": 0.5, "weighting": "none"})
    wrong = {"A": "B", "B": "A"}
    for item in items:
        right = _right(item)
        for user in (ann, bob):  # ann and bob answer right everywhere
            review.judgement_submit(item, user, {"better": shown_as(item, _rollout_id(item, right))})
        # cat answers wrong everywhere but on the last item, where cat outvotes nobody (two to one anyway)
        review.judgement_submit(item, cat, {"better": shown_as(item, _rollout_id(item, wrong[right]))})
    found = selectors.agreement(campaign)["gold"]["annotators"]
    assert {(c["annotator"], c["accuracy"], c["set_aside"], c["weight"]) for c in found} == {
        ("ann", 1.0, False, 1.0),
        ("bob", 1.0, False, 1.0),
        ("cat", 0.0, True, 0.0),
    }
    # Owner-set gold items are real rollouts: they are exported, labelled with their known answer.
    pairs = preference_pairs(campaign)
    assert [(p.item, p.chosen) for p in pairs] == [
        (item.pk, (item.rollout_a if _right(item) == "A" else item.rollout_b).response) for item in items
    ]
    rows = [json.loads(line) for line in export_campaign(campaign, "ratings_jsonl").lines]
    assert {(r["annotator"], r["weight"]) for r in rows} == {("ann", 1.0), ("bob", 1.0), ("cat", 0.0)}
    assert [r["gold"] for r in rows if r["annotator"] == "ann"] == [True, True, True, False]
    assert data.gold is None


def _rollout_id(item, side: str) -> int:
    return item.rollout_a_id if side == "A" else item.rollout_b_id


def test_a_set_aside_annotator_no_longer_decides_a_split_item(pair_run, annotators):
    ann, bob, _ = annotators
    campaign = pair_campaign([pair_run], [ann, bob], overlap=2, k=4)
    items = list(campaign.items.select_related("rollout_a", "rollout_b", "campaign").order_by("position"))
    for item in items[:3]:
        review.item_gold_set(item, {"better": _right(item)})
    for item in items:
        review.judgement_submit(item, ann, {"better": shown_as(item, _rollout_id(item, _right(item)))})
        review.judgement_submit(
            item, bob, {"better": shown_as(item, _rollout_id(item, "A" if _right(item) == "B" else "B"))}
        )
    # ann and bob split on every item: without gold weighting the data item has no label.
    assert [p.item for p in preference_pairs(campaign)] == [i.pk for i in items[:3]]
    review.campaign_update(campaign, gold_policy={"min_items": 3, "min_accuracy": 0.5})
    assert [p.item for p in preference_pairs(campaign)] == [i.pk for i in items]  # bob (0 of 3) set aside


def test_a_gold_item_leaves_the_reviewers_queue_and_unmarking_it_puts_it_back(pair_run, annotators, make_user):
    ann, bob, _ = annotators
    campaign = pair_campaign([pair_run], [ann, bob], overlap=2, k=1, reviewers=[make_user("reviewer", "rita")])
    item = campaign.items.select_related("rollout_a", "rollout_b", "campaign").get()
    review.judgement_submit(item, ann, {"better": "A"})
    review.judgement_submit(item, bob, {"better": "B"})
    item.refresh_from_db()
    assert item.review_state == ReviewState.PENDING
    review.item_gold_set(item, {"better": "A"})
    item.refresh_from_db()
    assert (item.review_state, item.gold_source) == (ReviewState.NONE, GoldSource.OWNER)
    review.item_gold_set(item, None)
    item.refresh_from_db()
    assert (item.review_state, item.gold) == (ReviewState.PENDING, None)


def test_gold_answers_are_checked_like_answers_and_only_for_graded_questions(pair_run, annotators):
    campaign = pair_campaign([pair_run], annotators, k=1, questions=PREFERENCE_AND_NOTE, activate=False)
    item = campaign.items.select_related("campaign", "rollout_a").get()
    with pytest.raises(InvalidInput) as refused:
        review.item_gold_set(item, {"better": "C", "note": "x"})
    assert {e["loc"] for e in refused.value.errors} == {"answers.better", "answers.note"}


# --- gold rows from a dataset's labels ------------------------------------------------------------


def gold_dataset(folder: Path, rows: list[dict], label_field: str = "label") -> Dataset:
    path = folder / f"gold-{uuid.uuid4().hex}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return Dataset.objects.create(
        name="gold",
        sha256=uuid.uuid4().hex * 2,
        format="jsonl",
        path=str(path),
        size_bytes=path.stat().st_size,
        row_count=len(rows),
        prompt_field="prompt",
        label_field=label_field,
        columns=sorted(rows[0]),
    )


@pytest.fixture
def single_run(experiment):
    return run_with_samples(
        experiment, {1: [sample(i, float(i % 2), f"{i}+{i}=", str(2 * i)) for i in range(9)]}, name="singles"
    )


def test_gold_rows_are_mixed_in_unmarked_with_their_known_answers(single_run, annotators, tmp_path):
    rows = [
        {"prompt": f"{n}*2=", "response": str(2 * n + n % 2), "label": "pass" if n % 2 == 0 else "no"} for n in range(6)
    ]
    dataset = gold_dataset(tmp_path, rows)
    ann = annotators[0]
    campaign = single_campaign(
        [single_run], [ann], k=9, questions=PASS_FAIL, gold={"dataset": dataset.pk, "share": 0.25}
    )
    # 9 sampled items; ceil(0.25 · 9 / 0.75) = 3 gold rows.
    gold_items = list(campaign.items.filter(gold__isnull=False).select_related("rollout_a"))
    assert len(gold_items) == 3 and campaign.items.count() == 12
    for item in gold_items:
        n = int(item.rollout_a.prompt.split("*")[0])
        assert item.gold == {"correct": n % 2 == 0} and item.gold_source == GoldSource.DATASET
        assert item.rollout_a.run_id is None and item.rollout_a.dataset_row == n
    # Mixed in: not all at the end of the queue.
    positions = sorted(item.position for item in gold_items)
    assert positions != [9, 10, 11]
    # Unmarked: a gold item shows exactly what an ordinary item shows.
    shown_gold = selectors.item_for_annotator(gold_items[0], ann)
    ordinary = campaign.items.filter(gold__isnull=True).select_related("campaign", "rollout_a").first()
    shown_ordinary = selectors.item_for_annotator(ordinary, ann)
    assert set(shown_gold) == set(shown_ordinary) and "gold" not in json.dumps(shown_gold)
    assert set(shown_gold["responses"][0]) == set(shown_ordinary["responses"][0])


def test_gold_rows_need_a_blind_campaign_and_a_label_that_answers_the_question(single_run, annotators, tmp_path):
    dataset = gold_dataset(tmp_path, [{"prompt": "p", "response": "r", "label": "secret-looking text"}])
    with pytest.raises(InvalidInput) as refused:
        single_campaign(
            [single_run], annotators, questions=PASS_FAIL, blind=False, gold={"dataset": dataset.pk, "share": 0.1}
        )
    assert [e["loc"] for e in refused.value.errors] == ["gold"]
    with pytest.raises(InvalidInput) as refused:
        single_campaign([single_run], annotators, questions=PASS_FAIL, gold={"dataset": dataset.pk, "share": 0.1})
    (error,) = refused.value.errors
    assert error["loc"] == "gold.dataset"
    assert error["msg"] == "row 1: the label ('label') is not an answer to 'correct': true/false"
    assert "secret" not in error["msg"]  # a row's content is never quoted: the dataset may be someone else's


def test_a_gold_share_larger_than_the_dataset_is_refused(single_run, annotators, tmp_path):
    dataset = gold_dataset(tmp_path, [{"prompt": "p", "response": "r", "label": True}])
    with pytest.raises(InvalidInput) as refused:
        single_campaign([single_run], annotators, k=9, questions=PASS_FAIL, gold={"dataset": dataset.pk, "share": 0.5})
    assert refused.value.errors == [
        {
            "loc": "gold.share",
            "msg": "needs 9 gold rows for this share of the campaign's items; the dataset has 1: lower the share "
            "or use a larger dataset",
        }
    ]


def test_a_preference_dataset_gives_gold_pairs_that_the_export_leaves_out(pair_run, annotators, tmp_path):
    dataset = gold_dataset(
        tmp_path, [{"prompt": f"q{n}", "chosen": "good", "rejected": "bad"} for n in range(4)], label_field=""
    )
    ann = annotators[0]
    campaign = pair_campaign([pair_run], [ann], k=4, gold={"dataset": dataset.pk, "share": 0.2})
    gold_items = list(campaign.items.filter(gold__isnull=False).select_related("rollout_a", "rollout_b", "campaign"))
    assert len(gold_items) == 1  # ceil(0.2 · 4 / 0.8)
    (item,) = gold_items
    assert (item.rollout_a.response, item.rollout_b.response, item.gold) == ("good", "bad", {"better": "A"})
    review.judgement_submit(item, ann, {"better": shown_as(item, item.rollout_a_id)})
    assert selectors.agreement(campaign)["gold"]["annotators"][0]["accuracy"] == 1.0
    assert preference_pairs(campaign) == []  # the dataset's own pair is not new data


def test_the_owner_sets_gold_reviewers_and_the_gold_policy_through_the_api(pair_run, annotators, make_user):
    owner = make_user("researcher", "rosalind")
    make_user("reviewer", "rita")
    client = APIClient()
    client.force_login(owner)
    campaign = pair_campaign([pair_run], annotators, k=2, user=owner)
    url = f"/api/review/campaigns/{campaign.pk}/"
    edited = client.patch(
        url,
        {"reviewers": ["rita"], "gold_policy": {"min_items": 5, "weighting": "accuracy"}, "show_suggestions": True},
        format="json",
    )
    assert edited.status_code == 200, edited.json()
    body = edited.json()
    assert (body["reviewers"], body["show_suggestions"]) == (["rita"], True)
    assert body["gold_policy"] == {"min_items": 5, "min_accuracy": 0.0, "weighting": "accuracy"}
    refused = client.patch(url, {"reviewers": ["ann"]}, format="json")
    assert refused.status_code == 400
    assert refused.json()["errors"] == [{"loc": "reviewers[0]", "msg": "'ann' does not have the reviewer role"}]

    item = campaign.items.first()
    marked = client.put(f"{url}items/{item.pk}/gold/", {"answers": {"better": "B"}}, format="json")
    assert marked.status_code == 200
    assert (marked.json()["gold"], marked.json()["gold_source"]) == ({"better": "B"}, "owner")
    bad = client.put(f"{url}items/{item.pk}/gold/", {"answers": {"better": "C"}}, format="json")
    assert bad.status_code == 400 and bad.json()["errors"][0]["loc"] == "answers.better"
    unmarked = client.delete(f"{url}items/{item.pk}/gold/")
    assert unmarked.status_code == 200 and unmarked.json()["gold"] is None
    assert client.get(url).json()["progress"]["gold_items"] == 0
