"""The annotators' queue: claim, release, skip and judge items under compare-and-set locks."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from posttrain.core.errors import IllegalTransition, InvalidInput, ItemUnavailable, NotAssigned
from posttrain.review.labels import disagreeing_questions
from posttrain.review.models import Campaign, CampaignState, Judgement, ReviewItem, ReviewState, Skip
from posttrain.review.questions import swap_pairwise, validate_answers
from posttrain.review.steps import check_step_answer, split_steps

MAX_SECONDS = 24 * 3600.0
CLAIM_BATCH = 20
MAX_CLAIM_ROUNDS = 50


def _require_assigned(campaign: Campaign, user: User) -> None:
    if not campaign.annotators.filter(pk=user.pk).exists():
        raise NotAssigned()


def _require_active(campaign: Campaign) -> None:
    state = Campaign.objects.values_list("state", flat=True).get(pk=campaign.pk)  # fresh: it may have closed
    if state != CampaignState.ACTIVE:
        raise IllegalTransition(f"the campaign is {state}: only an active campaign takes work", state)


def _free_for(user: User, now: datetime) -> Q:
    """Nobody else holds an unexpired lock."""
    return Q(locked_by__isnull=True) | Q(locked_until__lte=now) | Q(locked_by=user)


def open_items(campaign: Campaign, user: User) -> QuerySet[ReviewItem]:
    """Items the user may still judge: not done (fewer than `overlap` judgements), not judged by them."""
    judged = Judgement.objects.filter(item=OuterRef("pk"), annotator=user)
    return campaign.items.filter(judgement_count__lt=campaign.overlap).exclude(Exists(judged))


def _claimable(campaign: Campaign, user: User, now: datetime) -> QuerySet[ReviewItem]:
    """Open items nobody else holds, in queue order: unskipped ones first, then the ones this user
    skipped, earliest skip first."""
    last_skip = Skip.objects.filter(item=OuterRef("pk"), annotator=user).order_by("-at").values("at")[:1]
    return (
        open_items(campaign, user)
        .filter(_free_for(user, now))
        .annotate(skipped_at=Subquery(last_skip))
        .order_by(F("skipped_at").asc(nulls_first=True), "position")
    )


def _load(pk: int) -> ReviewItem:
    return ReviewItem.objects.select_related("campaign", "rollout_a__run", "rollout_b__run").get(pk=pk)


def item_claim_next(campaign: Campaign, user: User, *, now: datetime | None = None) -> ReviewItem | None:
    """Lock the user's next item and return it; None when nothing is left for them now.

    An item the user already holds comes back (its lock renewed): reloading the page loses nothing."""
    now = now or timezone.now()
    _require_assigned(campaign, user)
    _require_active(campaign)
    until = now + timedelta(seconds=campaign.lock_ttl_s)
    held = (
        open_items(campaign, user)
        .filter(locked_by=user, locked_until__gt=now)
        .order_by("position")
        .values_list("pk", flat=True)
        .first()
    )
    if held is not None and ReviewItem.objects.filter(pk=held, locked_by=user).update(locked_until=until):
        return _load(held)
    for _ in range(MAX_CLAIM_ROUNDS):
        candidates = list(_claimable(campaign, user, now).values_list("pk", flat=True)[:CLAIM_BATCH])
        if not candidates:
            return None
        for pk in candidates:
            # The same conditions as the candidate query, checked again in the UPDATE itself: another
            # annotator (or this user in another tab) may have taken or judged the item since.
            won = (
                open_items(campaign, user)
                .filter(pk=pk)
                .filter(_free_for(user, now))
                .update(locked_by=user, locked_until=until)
            )
            if won:
                return _load(pk)
    raise ItemUnavailable("other annotators took every item offered to you just now; ask for the next item again")


def item_release(item: ReviewItem, user: User) -> bool:
    """Give the item back without judging it; False when the user did not hold it."""
    _require_assigned(item.campaign, user)
    return ReviewItem.objects.filter(pk=item.pk, locked_by=user).update(locked_by=None, locked_until=None) == 1


def item_skip(item: ReviewItem, user: User, *, now: datetime | None = None) -> Skip:
    """Put the item off: its lock is released and it comes back after the user's unskipped items."""
    now = now or timezone.now()
    _require_assigned(item.campaign, user)
    _require_active(item.campaign)
    if Judgement.objects.filter(item=item, annotator=user).exists():
        raise ItemUnavailable("you have judged this item already; there is nothing to skip")
    with transaction.atomic():
        skip = Skip.objects.create(item=item, annotator=user, at=now)
        ReviewItem.objects.filter(pk=item.pk, locked_by=user).update(locked_by=None, locked_until=None)
    return skip


def _check_seconds(seconds: Any) -> float:
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or not 0 <= seconds <= MAX_SECONDS
    ):
        raise InvalidInput.one("seconds", f"must be a number of seconds from 0 to {MAX_SECONDS:.0f}")
    return float(seconds)


def judgement_submit(
    item: ReviewItem, user: User, answers: Any, seconds: Any = 0.0, *, now: datetime | None = None
) -> tuple[Judgement, bool]:
    """Store the user's answers on the item (as they saw it: pairwise "A" is the response shown as A);
    returns (judgement, created). The lock is released.

    A first judgement needs the item free for the user (they hold the lock, or nobody holds an unexpired
    one) and still short of `overlap` judgements. Submitting again edits the user's own judgement: the
    answers are replaced and the seconds added up."""
    now = now or timezone.now()
    campaign = item.campaign
    _require_assigned(campaign, user)
    _require_active(campaign)
    shown = _with_steps(campaign, item, validate_answers(campaign.questions, answers), "answers")
    seconds = _check_seconds(seconds)
    stored = swap_pairwise(campaign.questions, shown, item.display_swap)
    try:
        with transaction.atomic():
            existing = Judgement.objects.select_for_update().filter(item=item, annotator=user).first()
            if existing is not None:
                ReviewItem.objects.select_for_update().filter(pk=item.pk).first()  # as the first path's UPDATE
                existing.answers = stored
                existing.seconds += seconds
                existing.save(update_fields=["answers", "seconds", "updated_at"])
                _refresh_review_state(item.pk, campaign)
                return existing, False
            taken = (
                ReviewItem.objects.filter(pk=item.pk, judgement_count__lt=campaign.overlap)
                .filter(_free_for(user, now))
                .update(judgement_count=F("judgement_count") + 1, locked_by=None, locked_until=None)
            )
            if not taken:
                raise _why_unavailable(item.pk, campaign, now)
            judgement = Judgement.objects.create(item=item, annotator=user, answers=stored, seconds=seconds)
            _refresh_review_state(item.pk, campaign)
            return judgement, True
    except IntegrityError:  # the same user's concurrent submission won; this one changed nothing
        raise ItemUnavailable("you have judged this item already") from None


def _with_steps(campaign: Campaign, item: ReviewItem, answers: dict[str, Any], loc: str) -> dict[str, Any]:
    """Steps answers checked against the item's own response and normalised (posttrain.review.steps)."""
    questions = [q for q in campaign.questions if q["kind"] == "steps" and answers.get(q["key"]) is not None]
    if not questions:
        return answers
    steps = split_steps(item.rollout_a.response, item.rollout_a.tokens)
    return {
        **answers,
        **{q["key"]: check_step_answer(q, answers[q["key"]], steps, f"{loc}.{q['key']}") for q in questions},
    }


def _refresh_review_state(item_id: int, campaign: Campaign) -> None:
    """Called with the item's row locked, after a judgement was stored: a complete item whose annotators
    disagree is pending review; one they now agree on (an annotator edited their answer) is not. Decided
    and gold items keep their state."""
    fresh = ReviewItem.objects.values("judgement_count", "review_state", "gold").get(pk=item_id)
    if fresh["review_state"] == ReviewState.DECIDED or fresh["gold"] or fresh["judgement_count"] < campaign.overlap:
        return
    answers = list(Judgement.objects.filter(item_id=item_id).values_list("answers", flat=True))
    disagree = disagreeing_questions(campaign.questions, answers, campaign.review_rating_spread)
    state = ReviewState.PENDING if disagree else ReviewState.NONE
    if state != fresh["review_state"]:
        ReviewItem.objects.filter(pk=item_id).update(review_state=state)


def _why_unavailable(pk: int, campaign: Campaign, now: datetime) -> ItemUnavailable:
    fresh = ReviewItem.objects.get(pk=pk)
    if fresh.judgement_count >= campaign.overlap:
        return ItemUnavailable(f"the item has all its {campaign.overlap} judgement(s) already")
    # Released since the claim failed (locked_until cleared): held, but no longer until a known time.
    until = f" until {fresh.locked_until.isoformat()}" if fresh.locked_until is not None else ""
    return ItemUnavailable(f"another annotator holds this item{until}")
