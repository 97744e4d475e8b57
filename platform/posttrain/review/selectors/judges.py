"""Judge runs read: a campaign's latest judge and its answers on items, the judge runs, and a judge's
agreement with the humans.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from posttrain.review.agreement import judge_question_agreement
from posttrain.review.labels import JudgeSettings, graded, judge_answer, rounded_rating
from posttrain.review.models import Campaign, JudgeRun, JudgeRunState, JudgeScore, ReviewItem
from posttrain.review.selectors.labels_agreement import campaign_labels


def latest_judge(campaign: Campaign) -> JudgeRun | None:
    """The campaign's most recent finished judge run: the one whose pre-labels annotators may be shown."""
    return campaign.judge_runs.filter(state=JudgeRunState.DONE).order_by("-finished_at", "-pk").first()


def _judge_scores(judge: JudgeRun) -> dict[int, float | None]:
    return dict(JudgeScore.objects.filter(judge_run=judge, rollout__isnull=False).values_list("rollout_id", "score"))


def _judge_settings(judge: JudgeRun) -> JudgeSettings:
    return JudgeSettings(judge.threshold, judge.score_min, judge.score_max)


def _judge_item_answers(
    questions: list[dict[str, Any]], item: ReviewItem, scores: dict[int, float | None], settings: JudgeSettings
) -> dict[str, Any]:
    """The judge's answers on one item, as stored ("A" = rollout_a)."""
    score_a = scores.get(item.rollout_a_id)
    score_b = scores.get(item.rollout_b_id) if item.rollout_b_id is not None else None
    answers = {q["key"]: judge_answer(q, score_a, score_b, settings) for q in graded(questions)}
    return {key: value for key, value in answers.items() if value is not None}


def judge_runs(campaign: Campaign | None = None) -> QuerySet[JudgeRun]:
    runs = JudgeRun.objects.select_related("created_by", "project", "campaign")
    return runs.filter(campaign=campaign) if campaign is not None else runs


def judge_agreement(judge: JudgeRun) -> dict[str, Any]:
    """The judge against the humans' labels on its campaign, per question it answers (posttrain.review.
    agreement.judge_question_agreement): kappa, rates, confusion, and the items it gets wrong with what
    each side said. Human labels are the items' final labels (gold, decisions, weighted votes); a rating's
    weighted mean is rounded to a point of the scale."""
    campaign = judge.campaign
    if campaign is None:
        return {"judge": judge.pk, "questions": []}
    items = {item.pk: item for item in campaign.items.select_related("rollout_a").order_by("position")}
    labels = campaign_labels(campaign).labels
    scores = _judge_scores(judge)
    settings = _judge_settings(judge)
    questions = []
    for question in graded(campaign.questions):
        key = question["key"]
        pairs = {}
        for pk, item in items.items():
            human = labels.get(pk, {}).get(key)
            said = _judge_item_answers(campaign.questions, item, scores, settings).get(key)
            if human is None or said is None:
                continue
            value = rounded_rating(human.value) if question["kind"] == "rating" else human.value
            pairs[pk] = (value, said)
        entry = judge_question_agreement(question, pairs)
        if entry is None:
            continue
        entry["wrong"] = [
            {
                "item": pk,
                "position": items[pk].position,
                "prompt": items[pk].rollout_a.prompt[:200],
                "human": pairs[pk][0],
                "judge": pairs[pk][1],
            }
            for pk in entry["wrong"]
        ]
        questions.append(entry)
    return {"judge": judge.pk, "campaign": campaign.pk, "reward": judge.reward_name, "questions": questions}
