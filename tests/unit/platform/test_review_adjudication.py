"""Adjudication: items whose annotators disagree go to a reviewer queue that shows every judgement; the
reviewer's decision becomes the item's label, recorded with who decided; agreement is reported before
and after, checked against values computed by hand."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from posttrain.core.errors import IllegalTransition, InvalidInput, ItemUnavailable, NotAssigned
from posttrain.review import selectors
from posttrain.review import services as review
from posttrain.review.export import preference_pairs
from posttrain.review.models import ReviewState
from tests.unit.platform.helpers import pair_campaign, run_with_samples, sample, shown_as, single_campaign

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]

QUESTIONS = [
    {"key": "correct", "kind": "pass_fail", "label": "Correct?"},
    {"key": "stars", "kind": "rating", "label": "Stars", "min": 1, "max": 5},
]
PROMPTS = ["1+1=", "2+2=", "3+3=", "4+4="]
# Pass/fail per prompt: (ann, bob). They disagree on 2+2= and 4+4=.
CORRECT = {"1+1=": (True, True), "2+2=": (True, False), "3+3=": (False, False), "4+4=": (False, True)}
# Stars: one point apart on 1+1= (under the spread of 2), three points on 3+3=.
STARS = {"1+1=": (4, 5), "2+2=": (3, 3), "3+3=": (1, 4), "4+4=": (2, 2)}


@pytest.fixture
def people(make_user):
    return {
        "ann": make_user("annotator", "ann"),
        "bob": make_user("annotator", "bob"),
        "rita": make_user("reviewer", "rita"),
        "rex": make_user("reviewer", "rex"),
    }


@pytest.fixture
def run(experiment):
    return run_with_samples(
        experiment, {1: [sample(i, 1.0, prompt, str(2 * (i + 1))) for i, prompt in enumerate(PROMPTS)]}, name="r"
    )


@pytest.fixture
def campaign(run, people):
    return single_campaign(
        [run],
        [people["ann"], people["bob"]],
        k=4,
        overlap=2,
        questions=QUESTIONS,
        reviewers=[people["rita"], people["rex"]],
    )


def _items(campaign):
    return {i.rollout_a.prompt: i for i in campaign.items.select_related("rollout_a", "campaign")}


def judge_everything(campaign, people):
    for prompt, item in _items(campaign).items():
        for who, (correct, stars) in zip(("ann", "bob"), zip(CORRECT[prompt], STARS[prompt])):
            review.judgement_submit(item, people[who], {"correct": correct, "stars": stars})


def _states(campaign):
    return {i.rollout_a.prompt: i.review_state for i in campaign.items.select_related("rollout_a")}


def test_an_item_goes_to_review_when_its_last_judgement_disagrees(campaign, people):
    item = _items(campaign)["2+2="]
    review.judgement_submit(item, people["ann"], {"correct": True, "stars": 3})
    item.refresh_from_db()
    assert item.review_state == ReviewState.NONE  # one judgement of two: nothing to compare yet
    judge_everything(campaign, people)
    assert _states(campaign) == {
        "1+1=": ReviewState.NONE,  # stars 4 and 5: under the spread of 2
        "2+2=": ReviewState.PENDING,
        "3+3=": ReviewState.PENDING,  # stars 1 and 4
        "4+4=": ReviewState.PENDING,
    }


def test_an_annotator_who_changes_their_answer_to_agree_takes_the_item_out_of_review(campaign, people):
    judge_everything(campaign, people)
    review.judgement_submit(_items(campaign)["2+2="], people["bob"], {"correct": True, "stars": 3})
    assert _states(campaign)["2+2="] == ReviewState.NONE


def test_the_reviewer_sees_every_judgement_and_the_questions_in_dispute(campaign, people):
    judge_everything(campaign, people)
    item = review.item_claim_for_review(campaign, people["rita"])
    shown = selectors.item_for_reviewer(item, people["rita"])
    prompt = shown["prompt"]
    assert shown["judgements"] == [
        {"annotator": "ann", "answers": {"correct": CORRECT[prompt][0], "stars": STARS[prompt][0]}},
        {"annotator": "bob", "answers": {"correct": CORRECT[prompt][1], "stars": STARS[prompt][1]}},
    ]
    disputed = {"2+2=": ["correct"], "3+3=": ["stars"], "4+4=": ["correct"]}[prompt]
    assert shown["disputed"] == disputed
    assert set(shown["agreed"]) == {"correct", "stars"} - set(disputed)


def test_two_reviewers_never_hold_the_same_item_and_each_decision_records_who_decided(campaign, people):
    judge_everything(campaign, people)
    rita_item = review.item_claim_for_review(campaign, people["rita"])
    rex_item = review.item_claim_for_review(campaign, people["rex"])
    assert rita_item.pk != rex_item.pk
    with pytest.raises(ItemUnavailable):
        review.decision_submit(rita_item, people["rex"], {"correct": True, "stars": 3})
    decided = review.decision_submit(rita_item, people["rita"], {"correct": True, "stars": 3})
    assert (decided.review_state, decided.decided_by, decided.decision) == (
        ReviewState.DECIDED,
        people["rita"],
        {"correct": True, "stars": 3},
    )
    assert decided.locked_by is None and decided.decided_at is not None


def test_a_decision_must_answer_the_questions_in_dispute(campaign, people):
    judge_everything(campaign, people)
    item = _items(campaign)["3+3="]
    with pytest.raises(InvalidInput) as refused:
        review.decision_submit(item, people["rita"], {"correct": False})
    assert refused.value.errors == [{"loc": "answers.stars", "msg": "required: Stars"}]


def test_only_the_campaigns_reviewers_adjudicate_and_not_before_it_starts(run, campaign, people, make_user):
    judge_everything(campaign, people)
    with pytest.raises(NotAssigned):
        review.item_claim_for_review(campaign, make_user("reviewer", "stranger"))
    draft = single_campaign([run], [people["ann"]], questions=QUESTIONS, reviewers=[people["rita"]], activate=False)
    with pytest.raises(IllegalTransition):
        review.item_claim_for_review(draft, people["rita"])


def test_the_decision_is_the_items_label(campaign, people):
    judge_everything(campaign, people)
    item = _items(campaign)["2+2="]
    before = selectors.campaign_labels(campaign).labels[item.pk]
    assert "correct" not in before  # one pass, one fail: no label
    review.decision_submit(item, people["rita"], {"correct": False})
    after = selectors.campaign_labels(campaign).labels[item.pk]
    assert (after["correct"].value, after["correct"].source) == (False, "decision")
    assert (after["stars"].value, after["stars"].source) == (3.0, "annotators")


def test_agreement_before_and_after_adjudication_by_hand(campaign, people):
    judge_everything(campaign, people)
    # Pass/fail, ann T T F F, bob T F F T. Before: p_o = 1/2, p_e = 1/2·1/2 + 1/2·1/2 = 1/2, κ = 0.
    #   α (nominal): n = 8, n_T = n_F = 4; two split items, o_TF + o_FT = 4: α = 1 − 7·4 / (2·4·4) = 1/8.
    report = selectors.agreement(campaign)
    correct = next(q for q in report["questions"] if q["key"] == "correct")
    assert correct["kappa"] == pytest.approx(0.0) and correct["alpha"] == pytest.approx(1 / 8)
    # The reviewer decides 2+2= pass: bob's fail there counts as pass after adjudication.
    #   After: ann T T F F, bob T T F T: p_o = 3/4, p_e = 1/2·3/4 + 1/2·1/4 = 1/2, κ = 1/2;
    #   n_T = 5, n_F = 3, one split item: α = 1 − 7·2 / (2·5·3) = 8/15.
    review.decision_submit(_items(campaign)["2+2="], people["rita"], {"correct": True})
    report = selectors.agreement(campaign)
    before = next(q for q in report["questions"] if q["key"] == "correct")
    after = next(q for q in report["after_adjudication"]["questions"] if q["key"] == "correct")
    assert before["kappa"] == pytest.approx(0.0)  # the annotators' own answers are unchanged
    assert after["kappa"] == pytest.approx(1 / 2) and after["alpha"] == pytest.approx(8 / 15)
    assert report["adjudication"] == {"pending": 2, "decided": 1}
    # Deciding 4+4= too: both annotators' answers now agree everywhere: κ = α = 1.
    review.decision_submit(_items(campaign)["4+4="], people["rex"], {"correct": False})
    after = next(q for q in selectors.agreement(campaign)["after_adjudication"]["questions"] if q["key"] == "correct")
    assert after["kappa"] == pytest.approx(1.0) and after["alpha"] == pytest.approx(1.0)


def test_a_decided_pair_exports_the_reviewers_preference(experiment, people):
    run = run_with_samples(
        experiment, {1: [sample(0, 1.0, "1+1=", "2", group=0), sample(1, 0.0, "1+1=", "3", group=0)]}, name="p"
    )
    campaign = pair_campaign([run], [people["ann"], people["bob"]], overlap=2, k=1, reviewers=[people["rita"]])
    item = campaign.items.select_related("rollout_a", "rollout_b", "campaign").get()
    review.judgement_submit(item, people["ann"], {"better": shown_as(item, item.rollout_a_id)})
    review.judgement_submit(item, people["bob"], {"better": shown_as(item, item.rollout_b_id)})
    assert preference_pairs(campaign) == []  # A against B: no preference
    review.decision_submit(item, people["rita"], {"better": "B"})  # stored terms: B = rollout_b
    (pair,) = preference_pairs(campaign)
    assert (pair.chosen, pair.rejected) == (item.rollout_b.response, item.rollout_a.response)


# --- through the API ---------------------------------------------------------------------------------


def test_a_reviewer_decides_item_after_item_through_the_api(campaign, people):
    judge_everything(campaign, people)
    client = APIClient()
    client.force_login(people["rita"])
    queue = client.get("/api/review/adjudication/").json()
    assert [(q["id"], q["pending"], q["decided"]) for q in queue] == [(campaign.pk, 3, 0)]
    payload = client.post(f"/api/review/campaigns/{campaign.pk}/adjudicate/next/").json()
    decided = 0
    while payload is not None:
        item = payload["item"]
        refused = client.post(f"/api/review/items/{item['id']}/decision/", {"answers": {}}, format="json")
        assert refused.status_code == 400 and refused.json()["errors"][0]["loc"] == "answers"
        answers = {key: (3 if key == "stars" else True) for key in item["disputed"]}
        response = client.post(
            f"/api/review/items/{item['id']}/decision/", {"answers": answers, "claim_next": True}, format="json"
        )
        assert response.status_code == 200 and response.json()["decided_by"] == "rita"
        decided += 1
        payload = response.json()["next"]
    assert decided == 3
    assert client.post(f"/api/review/campaigns/{campaign.pk}/adjudicate/next/").status_code == 204
    assert client.get("/api/review/adjudication/").json()[0]["decided_by_me"] == 3
    annotator = APIClient()
    annotator.force_login(people["ann"])
    assert annotator.post(f"/api/review/campaigns/{campaign.pk}/adjudicate/next/").status_code == 403


def test_the_adjudication_pages_are_for_the_campaigns_reviewers(client, campaign, people, make_user):
    client.force_login(people["rita"])
    assert client.get("/adjudicate/").status_code == 200
    assert client.get(f"/adjudicate/{campaign.pk}/").status_code == 200
    assert ">Adjudicate</a>" in client.get("/").content.decode()
    client.force_login(make_user("reviewer", "stranger"))
    assert client.get(f"/adjudicate/{campaign.pk}/").status_code == 404
    client.force_login(people["ann"])
    assert client.get("/adjudicate/").status_code == 403
