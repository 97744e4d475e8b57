"""The reviewers' queue: adjudication of the items whose annotators disagree."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.utils import timezone

from posttrain.core.errors import IllegalTransition, ItemUnavailable, NotAssigned
from posttrain.review.labels import disagreeing_questions
from posttrain.review.models import Campaign, CampaignState, Judgement, ReviewItem, ReviewState
from posttrain.review.questions import validate_known_answers
from posttrain.review.services.queue import CLAIM_BATCH, MAX_CLAIM_ROUNDS, _free_for, _load, _with_steps


def _require_reviewer(campaign: Campaign, user: User) -> None:
    if not campaign.reviewers.filter(pk=user.pk).exists():
        raise NotAssigned()


def _require_reviewable(campaign: Campaign) -> None:
    """Adjudication goes on while annotators work and after the campaign closes; a draft has no work."""
    state = Campaign.objects.values_list("state", flat=True).get(pk=campaign.pk)
    if state == CampaignState.DRAFT:
        raise IllegalTransition("the campaign is draft: nothing to adjudicate before it is active", state)


def review_items(campaign: Campaign) -> QuerySet[ReviewItem]:
    """Items waiting for a reviewer: complete, not gold, and their annotators disagree."""
    return campaign.items.filter(review_state=ReviewState.PENDING)


def item_claim_for_review(campaign: Campaign, user: User, *, now: datetime | None = None) -> ReviewItem | None:
    """Lock the reviewer's next pending item (the one they hold first) and return it; None when none is left."""
    now = now or timezone.now()
    _require_reviewer(campaign, user)
    _require_reviewable(campaign)
    until = now + timedelta(seconds=campaign.lock_ttl_s)
    pending = review_items(campaign)
    for _ in range(MAX_CLAIM_ROUNDS):
        held = pending.filter(locked_by=user, locked_until__gt=now).order_by("position").values_list("pk", flat=True)
        free = pending.filter(_free_for(user, now)).order_by("position").values_list("pk", flat=True)
        candidates = [*held[:1], *free[:CLAIM_BATCH]]
        if not candidates:
            return None
        for pk in candidates:
            # Checked again in the UPDATE: another reviewer may have taken or decided it since.
            if pending.filter(pk=pk).filter(_free_for(user, now)).update(locked_by=user, locked_until=until):
                return _load(pk)
    raise ItemUnavailable("other reviewers took every item offered to you just now; ask for the next item again")


def item_review_release(item: ReviewItem, user: User) -> bool:
    """Give a pending item back undecided; False when the reviewer did not hold it."""
    _require_reviewer(item.campaign, user)
    released = ReviewItem.objects.filter(pk=item.pk, locked_by=user, review_state=ReviewState.PENDING).update(
        locked_by=None, locked_until=None
    )
    return released == 1


def decision_submit(item: ReviewItem, user: User, answers: Any, *, now: datetime | None = None) -> ReviewItem:
    """The reviewer's answers become the item's label (recorded with who decided and when). Pairwise "A"
    means rollout_a (the reviewer sees the stored order). The questions the annotators disagree on are
    required; a decided item may be decided again (the last decision stands)."""
    now = now or timezone.now()
    campaign = item.campaign
    _require_reviewer(campaign, user)
    _require_reviewable(campaign)
    judged = list(Judgement.objects.filter(item=item).values_list("answers", flat=True))
    required = tuple(disagreeing_questions(campaign.questions, judged, campaign.review_rating_spread))
    decided = _with_steps(
        campaign, item, validate_known_answers(campaign.questions, answers, "answers", required), "answers"
    )
    updated = (
        ReviewItem.objects.filter(pk=item.pk, review_state__in=[ReviewState.PENDING, ReviewState.DECIDED])
        .filter(_free_for(user, now))
        .update(
            decision=decided,
            decided_by=user,
            decided_at=now,
            review_state=ReviewState.DECIDED,
            locked_by=None,
            locked_until=None,
        )
    )
    if not updated:
        fresh = ReviewItem.objects.get(pk=item.pk)
        if fresh.review_state == ReviewState.NONE:
            raise ItemUnavailable("this item's annotators agree (or it is gold): it needs no decision")
        raise ItemUnavailable("another reviewer holds this item")
    return _load(item.pk)
