"""What a reviewer sees: the campaigns they review, their adjudication queue, and an item with every
judgement.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.utils import timezone

from posttrain.review.labels import disagreeing_questions, graded
from posttrain.review.models import Campaign, CampaignState, Judgement, ReviewItem, ReviewState
from posttrain.review.selectors.annotator_view import _item_head, _shown, _steps_view
from posttrain.review.selectors.judges import _judge_item_answers, _judge_scores, _judge_settings, latest_judge
from posttrain.review.services import review_items


def reviewer_campaigns(user: User) -> QuerySet[Campaign]:
    """The campaigns the user reviews (any state): reviewers reach nothing else."""
    return Campaign.objects.filter(reviewers=user)


def reviewer_items(user: User) -> QuerySet[ReviewItem]:
    return ReviewItem.objects.select_related("campaign", "rollout_a__run", "rollout_b__run").filter(
        campaign__reviewers=user
    )


def reviewer_queue(user: User, now: datetime | None = None) -> list[dict[str, Any]]:
    """The user's active or closed campaigns with what is left to adjudicate in each."""
    now = now or timezone.now()
    entries = []
    campaigns = (
        reviewer_campaigns(user)
        .filter(state__in=[CampaignState.ACTIVE, CampaignState.CLOSED])
        .order_by("created_at", "pk")
    )
    for campaign in campaigns:
        pending = review_items(campaign)
        entries.append(
            {
                "id": campaign.pk,
                "name": campaign.name,
                "kind": campaign.kind,
                "state": campaign.state,
                "pending": pending.count(),
                "held_by_others": pending.filter(locked_by__isnull=False, locked_until__gt=now)
                .exclude(locked_by=user)
                .count(),
                "decided": campaign.items.filter(review_state=ReviewState.DECIDED).count(),
                "decided_by_me": campaign.items.filter(decided_by=user).count(),
            }
        )
    return entries


def item_for_reviewer(item: ReviewItem, user: User) -> dict[str, Any]:
    """A pending (or decided) item with every judgement: the responses in stored order ("A" = rollout_a, as
    the judgements' pairwise answers are stored), who answered what, the questions they disagree on, the
    annotators' plurality where they agree, and the decision so far."""
    campaign = item.campaign
    rows = [
        (j.annotator.get_username(), j.answers)
        for j in Judgement.objects.filter(item=item).select_related("annotator").order_by("annotator__username")
    ]
    disputed = disagreeing_questions(
        campaign.questions, [answers for _, answers in rows], campaign.review_rating_spread
    )
    judge = latest_judge(campaign)
    scores = _judge_scores(judge) if judge is not None else {}
    return {
        **_item_head(item),
        "responses": [
            {"label": label, "text": rollout.response, "steps": _steps_view(campaign, rollout)}
            for label, rollout in zip("AB", _shown(item, swap=False))
        ],
        "judgements": [{"annotator": name, "answers": answers} for name, answers in rows],
        "disputed": disputed,
        "agreed": {
            q["key"]: rows[0][1].get(q["key"])
            for q in graded(campaign.questions)
            if q["key"] not in disputed and rows and rows[0][1].get(q["key"]) is not None
        },
        "judge": None
        if judge is None
        else {
            "reward": judge.reward_name,
            "answers": _judge_item_answers(campaign.questions, item, scores, _judge_settings(judge)),
        },
        "review_state": item.review_state,
        "decision": item.decision,
        "locked_until": item.locked_until if item.locked_by_id == user.pk else None,
    }
