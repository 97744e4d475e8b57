"""Judges: a registered reward pre-scores a campaign's items as a recorded job on a worker (its task routed to
the user_code queue); annotators see its suggestion or not; the campaign reports its agreement with the
humans (kappa, true/false positive rates per question, the items it gets wrong), checked against values
computed by hand; a judge that agrees well is registered as a reward; a judge's scores over runs'
rollouts pick the items where it disputes the reward."""

from __future__ import annotations

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from posttrain.core import job_runner
from posttrain.core.errors import InvalidInput
from posttrain.core.task_queue import celery_app
from posttrain.registry.models import RewardFunction
from posttrain.review import judging, selectors
from posttrain.review import services as review
from posttrain.review.agreement import judge_question_agreement
from posttrain.review.labels import JudgeSettings, judge_answer
from posttrain.review.models import JudgeRunState, JudgeScore
from tests.support.stack import free_port
from tests.unit.platform.helpers import (
    a_campaign_owner,
    default_project,
    pair_campaign,
    run_with_samples,
    sample,
    shown_as,
    single_campaign,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]

CORRECT = [{"key": "correct", "kind": "pass_fail", "label": "Correct?"}]
STARS = {"key": "stars", "kind": "rating", "label": "Stars", "min": 1, "max": 5}


# --- a judge's answers and agreement, by hand ----------------------------------------------------------


def test_a_judge_answers_from_its_scores():
    settings_ = JudgeSettings(threshold=0.5, score_min=-2.0, score_max=2.0)
    passes = {"kind": "pass_fail"}
    assert [judge_answer(passes, s, None, settings_) for s in (0.49, 0.5, 3.0)] == [False, True, True]
    # Ratings: [-2, 2] onto 1..5, rounded half up and clipped: -2 → 1, 0 → 3, 0.5 → 3.5 → 4, 9 → 5.
    assert [judge_answer(STARS, s, None, settings_) for s in (-2.0, 0.0, 0.5, 9.0)] == [1, 3, 4, 5]
    pairwise = {"kind": "pairwise"}
    assert [judge_answer(pairwise, a, b, settings_) for a, b in ((1, 0), (0, 1), (0.3, 0.3))] == ["A", "B", "tie"]
    assert judge_answer(passes, None, None, settings_) is None  # the reward failed on it: no opinion


def test_pass_fail_agreement_kappa_and_rates_by_hand():
    humans = [True] * 5 + [False] * 5
    judge = [True, True, True, True, False, True, False, False, False, False]
    found = judge_question_agreement(
        {"key": "correct", "kind": "pass_fail", "label": "Correct?"},
        {i: pair for i, pair in enumerate(zip(humans, judge))},
    )
    # TP 4, FN 1, FP 1, TN 4: TPR 4/5, FPR 1/5. p_o = 8/10, p_e = 1/2·1/2 + 1/2·1/2 = 1/2: κ = (0.8 − 0.5)/0.5 = 0.6.
    assert found["kappa"] == pytest.approx(0.6)
    assert found["agreement"] == pytest.approx(0.8)
    assert found["rates"] == {
        "tp": 4,
        "fn": 1,
        "fp": 1,
        "tn": 4,
        "tpr": pytest.approx(0.8),
        "fnr": pytest.approx(0.2),
        "fpr": pytest.approx(0.2),
        "tnr": pytest.approx(0.8),
    }
    assert found["wrong"] == [4, 5]
    assert found["confusion"] == [
        {"human": False, "judge": False, "items": 4},
        {"human": False, "judge": True, "items": 1},
        {"human": True, "judge": False, "items": 1},
        {"human": True, "judge": True, "items": 4},
    ]


def test_pairwise_rates_are_per_side_and_ratings_use_quadratic_kappa():
    pairs = {0: ("A", "A"), 1: ("A", "B"), 2: ("B", "B"), 3: ("tie", "A")}
    found = judge_question_agreement({"key": "b", "kind": "pairwise", "label": "B"}, pairs)
    # Side A: human A on items 0, 1; judge A on 0 and 3: TPR 1/2, FPR 1/2 (item 3 of items 2, 3).
    assert (found["rates"]["A"]["tpr"], found["rates"]["A"]["fpr"]) == (0.5, 0.5)
    # Side B: human B on item 2 only, judge B on 1 and 2: TPR 1, FPR 1/3.
    assert found["rates"]["B"]["tpr"] == 1.0 and found["rates"]["B"]["fpr"] == pytest.approx(1 / 3)
    # Ratings 1..5, humans 1 3 5 and judge 1 3 4, weights (i − j)²/16: observed (1/16)/3 = 1/48;
    # expected Σ p_h(i)·p_j(j)·w = (0+4+9 + 4+0+1 + 16+4+1)/9/16 = 39/144: κ = 1 − (1/48)/(39/144) = 12/13.
    rating = judge_question_agreement(STARS, {0: (1, 1), 1: (3, 3), 2: (5, 4)})
    assert rating["kappa"] == pytest.approx(12 / 13)
    assert (rating["rates"]["tpr"], rating["rates"]["fpr"]) == (1.0, 0.0)  # above the midpoint 3: 5 and 4


# --- a judge run on the worker's side ----------------------------------------------------------------


@pytest.fixture
def people(make_user):
    return make_user("annotator", "ann"), make_user("annotator", "bob")


@pytest.fixture
def exact(db):
    return RewardFunction.objects.create(name="exact", kind="builtin", spec={"type": "exact_match", "name": "exact"})


# Responses against labels: the exact-match judge passes 2+2= and 5+5= only ("eight" holds no number).
ROLLOUTS = [("2+2=", "4", "4"), ("3+3=", "7", "6"), ("4+4=", "eight", "8"), ("5+5=", "10", "10"), ("6+6=", "13", "12")]


@pytest.fixture
def run(experiment):
    return run_with_samples(
        experiment,
        {1: [sample(i, 0.5, prompt, response, label=label) for i, (prompt, response, label) in enumerate(ROLLOUTS)]},
        name="r",
    )


def run_judge(campaign, reward, django_capture_on_commit_callbacks, monkeypatch, **settings_):
    """Creates the judge run as the API does; checks the task it sends after commit; runs the worker's side."""
    sent = []
    monkeypatch.setattr(job_runner, "task_send", lambda name, *args, expires=None: sent.append((name, *args)))
    with django_capture_on_commit_callbacks(execute=True):
        judge = judging.judge_run_create(campaign, reward, **settings_)
    assert sent == [("review_judge_run", str(judge.pk))]
    assert judge.state == JudgeRunState.QUEUED and judge.total == campaign.rollouts.count()
    judging.judge_run_execute(judge.pk)
    judge.refresh_from_db()
    return judge


def test_the_judge_task_goes_to_the_user_code_queue():
    assert settings.CELERY_TASK_ROUTES["workers.review_judge_run"] == {"queue": "user_code"}
    assert celery_app().amqp.router.route({}, "workers.review_judge_run")["queue"].name == "user_code"


def test_a_judge_run_scores_every_rollout_of_the_campaign_once(
    run, people, exact, django_capture_on_commit_callbacks, monkeypatch
):
    campaign = single_campaign([run], list(people), k=5, questions=CORRECT)
    judge = run_judge(campaign, exact, django_capture_on_commit_callbacks, monkeypatch)
    assert (judge.state, judge.scored, judge.failed_samples, judge.error) == (JudgeRunState.DONE, 5, 0, "")
    scores = {s.rollout.prompt: s.score for s in JudgeScore.objects.filter(judge_run=judge).select_related("rollout")}
    assert scores == {"2+2=": 1.0, "3+3=": 0.0, "4+4=": 0.0, "5+5=": 1.0, "6+6=": 0.0}
    judging.judge_run_execute(judge.pk)  # a repeated task finds it done: nothing scored twice
    assert JudgeScore.objects.filter(judge_run=judge).count() == 5


def test_a_judge_that_cannot_reach_its_server_has_no_opinion_and_still_finishes(
    run, people, django_capture_on_commit_callbacks, monkeypatch
):
    down = RewardFunction.objects.create(
        name="down",
        kind="http",
        spec={"type": "http", "name": "down", "url": f"http://127.0.0.1:{free_port()}/", "retries": 0, "timeout_s": 1},
    )
    campaign = single_campaign([run], list(people), k=5, questions=CORRECT)
    judge = run_judge(campaign, down, django_capture_on_commit_callbacks, monkeypatch)
    assert (judge.state, judge.scored, judge.failed_samples) == (JudgeRunState.DONE, 5, 5)
    assert set(JudgeScore.objects.filter(judge_run=judge).values_list("score", flat=True)) == {None}
    assert all(JudgeScore.objects.filter(judge_run=judge).values_list("errors", flat=True))


def test_annotators_see_the_suggestion_only_when_the_campaign_shows_it(
    run, people, exact, django_capture_on_commit_callbacks, monkeypatch
):
    ann, _ = people
    campaign = single_campaign([run], [ann], k=5, questions=CORRECT)
    run_judge(campaign, exact, django_capture_on_commit_callbacks, monkeypatch)
    item = campaign.items.select_related("campaign", "rollout_a").get(rollout_a__prompt="3+3=")
    assert selectors.item_for_annotator(item, ann)["suggestion"] is None  # blind to the judge by default
    review.campaign_update(campaign, show_suggestions=True)
    item.campaign.refresh_from_db()
    assert selectors.item_for_annotator(item, ann)["suggestion"] == {
        "judge": "exact",
        "answers": {"correct": False},
        "scores": [0.0],
    }


def test_a_pair_suggestion_names_the_responses_as_the_annotator_sees_them(
    experiment, people, exact, django_capture_on_commit_callbacks, monkeypatch
):
    ann, _ = people
    run = run_with_samples(
        experiment,
        {1: [sample(0, 1.0, "1+1=", "2", group=0, label="2"), sample(1, 0.0, "1+1=", "3", group=0, label="2")]},
    )
    campaign = pair_campaign([run], [ann], k=1, show_suggestions=True)
    run_judge(campaign, exact, django_capture_on_commit_callbacks, monkeypatch)
    item = campaign.items.select_related("campaign", "rollout_a", "rollout_b").get()
    right = shown_as(item, item.rollout_a_id if item.rollout_a.response == "2" else item.rollout_b_id)
    suggestion = selectors.item_for_annotator(item, ann)["suggestion"]
    assert suggestion["answers"] == {"better": right}
    assert suggestion["scores"] == ([1.0, 0.0] if right == "A" else [0.0, 1.0])


def judged_by_humans(campaign, people, passes):
    for item in campaign.items.select_related("rollout_a", "campaign"):
        for user in people:
            review.judgement_submit(item, user, {"correct": item.rollout_a.prompt in passes})


def test_the_campaign_reports_the_judges_agreement_with_the_humans_and_the_items_it_gets_wrong(
    run, people, exact, django_capture_on_commit_callbacks, monkeypatch
):
    campaign = single_campaign([run], list(people), k=5, overlap=2, questions=CORRECT)
    # The humans pass 4+4= ("eight" is right); the judge (exact match) fails it: TP 2, FN 1, FP 0, TN 2.
    judged_by_humans(campaign, people, {"2+2=", "4+4=", "5+5="})
    judge = run_judge(campaign, exact, django_capture_on_commit_callbacks, monkeypatch)
    (found,) = selectors.judge_agreement(judge)["questions"]
    # p_o = 4/5; humans pass 3/5, judge pass 2/5: p_e = 3/5·2/5 + 2/5·3/5 = 12/25; κ = (4/5 − 12/25)/(13/25) = 8/13.
    assert found["items"] == 5
    assert found["kappa"] == pytest.approx(8 / 13)
    assert (found["rates"]["tpr"], found["rates"]["fpr"]) == (pytest.approx(2 / 3), 0.0)
    assert [(w["prompt"], w["human"], w["judge"]) for w in found["wrong"]] == [("4+4=", True, False)]


def test_a_judge_that_disagrees_with_the_humans_is_not_registered_as_a_reward(
    run, people, exact, researcher, django_capture_on_commit_callbacks, monkeypatch
):
    campaign = single_campaign([run], list(people), k=5, overlap=2, questions=CORRECT)
    judged_by_humans(campaign, people, {"2+2=", "3+3=", "4+4=", "5+5="})
    judge = run_judge(campaign, exact, django_capture_on_commit_callbacks, monkeypatch)
    # TP 2, FN 2, FP 0, TN 1: p_o = 3/5; humans pass 4/5, judge 2/5: p_e = 8/25 + 3/25 = 11/25; κ = 4/14 = 2/7.
    client = APIClient()
    client.force_login(researcher)
    refused = client.post(f"/api/review/judge-runs/{judge.pk}/register/", {"name": "exact, checked"}, format="json")
    assert refused.status_code == 400
    assert refused.json()["errors"] == [
        {
            "loc": "question",
            "msg": "the judge's kappa on 'correct' is 0.286, below 0.6 (substantial agreement): it would train the "
            "policy on its disagreements with the humans",
        }
    ]
    assert not RewardFunction.objects.filter(name="exact, checked").exists()


def test_a_judge_that_agrees_well_is_registered_as_a_reward_with_its_figures(
    run, people, exact, researcher, django_capture_on_commit_callbacks, monkeypatch
):
    campaign = single_campaign([run], list(people), k=5, overlap=2, questions=CORRECT)
    judged_by_humans(campaign, people, {"2+2=", "5+5="})
    judge = run_judge(campaign, exact, django_capture_on_commit_callbacks, monkeypatch)
    client = APIClient()
    client.force_login(researcher)
    response = client.post(f"/api/review/judge-runs/{judge.pk}/register/", {"name": "exact (checked)"}, format="json")
    assert response.status_code == 201, response.json()
    reward = RewardFunction.objects.get(name="exact (checked)")
    assert (reward.kind, reward.spec["type"]) == ("builtin", "exact_match")
    assert "Cohen's kappa 1.000" in reward.description and "false positive rate 0.000" in reward.description
    again = client.post(f"/api/review/judge-runs/{judge.pk}/register/", {"name": "exact (checked)"}, format="json")
    assert again.status_code == 400 and again.json()["errors"][0]["loc"] == "name"


def test_a_judge_runs_through_the_api_and_its_progress_is_read_back(run, people, exact, researcher):
    campaign = single_campaign([run], list(people), k=5, questions=CORRECT)
    client = APIClient()
    client.force_login(researcher)
    bad = client.post(
        f"/api/review/campaigns/{campaign.pk}/judges/", {"reward": exact.pk, "score_max": -1}, format="json"
    )
    assert bad.status_code == 400 and bad.json()["errors"] == [
        {"loc": "score_max", "msg": "must be greater than score_min (0.0)"}
    ]
    started = client.post(f"/api/review/campaigns/{campaign.pk}/judges/", {"reward": exact.pk}, format="json")
    assert started.status_code == 202 and started.json()["state"] == "queued" and started.json()["total"] == 5
    judging.judge_run_execute(started.json()["id"])  # the worker's side
    listed = client.get(f"/api/review/campaigns/{campaign.pk}/judges/").json()
    assert [(j["id"], j["state"], j["scored"]) for j in listed] == [(started.json()["id"], "done", 5)]


def test_a_judge_of_runs_rollouts_picks_where_it_disputes_the_reward(run, people, exact):
    with pytest.raises(InvalidInput) as refused:
        judging.judge_pool_create(
            exact, {"runs": [str(run.id)], "steps": [9]}, a_campaign_owner(), project=default_project()
        )
    assert refused.value.errors == [{"loc": "source", "msg": "the runs have no rollouts at these steps"}]
    pool = judging.judge_pool_create(
        exact, {"runs": [str(run.id)], "steps": [1]}, a_campaign_owner(), project=default_project()
    )
    assert pool.total == 5
    with pytest.raises(InvalidInput) as refused:
        single_campaign([run], list(people), k=2, rule="reward_vs_judge", source={"judge_run": pool.pk})
    assert refused.value.errors[0]["msg"] == f"judge run {pool.pk} is queued: wait until it is done"
    judging.judge_run_execute(pool.pk)
    # Every reward is 0.5; the judge says 1 or 0: all disputes are 0.5, ties keep (step, index) order.
    campaign = single_campaign([run], list(people), k=2, rule="reward_vs_judge", source={"judge_run": pool.pk})
    picked = sorted(i.rollout_a.prompt for i in campaign.items.select_related("rollout_a"))
    assert picked == ["2+2=", "3+3="]
    assert {i.selection["score"] for i in campaign.items.all()} == {0.5}
