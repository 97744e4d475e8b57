"""Gold answers set by the owner on an item (a gold item leaves the reviewers' queue)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from posttrain.core.errors import InvalidInput
from posttrain.review.models import GoldSource, ReviewItem, ReviewState
from posttrain.review.questions import validate_known_answers
from posttrain.review.services.queue import _refresh_review_state, _with_steps


def item_gold_set(item: ReviewItem, answers: Any) -> ReviewItem:
    """Mark the item as gold with its known answers (graded questions; pairwise "A" = rollout_a), or
    unmark it (`answers` None). A gold item leaves the reviewers' queue: its answer is known."""
    campaign = item.campaign
    with transaction.atomic():
        locked = ReviewItem.objects.select_for_update().select_related("rollout_a").get(pk=item.pk)
        if answers is None:
            if locked.gold_source == GoldSource.DATASET:
                raise InvalidInput.one("answers", "a gold row from the campaign's dataset stays gold")
            locked.gold, locked.gold_source = None, GoldSource.NONE
            locked.save(update_fields=["gold", "gold_source"])
            _refresh_review_state(locked.pk, campaign)
        else:
            known = _with_steps(
                campaign, locked, validate_known_answers(campaign.questions, answers, "answers"), "answers"
            )
            locked.gold = known
            if locked.gold_source != GoldSource.DATASET:
                locked.gold_source = GoldSource.OWNER
            fields = ["gold", "gold_source"]
            if locked.review_state == ReviewState.PENDING:
                locked.review_state = ReviewState.NONE
                fields.append("review_state")
            locked.save(update_fields=fields)
    item.refresh_from_db()
    return item
