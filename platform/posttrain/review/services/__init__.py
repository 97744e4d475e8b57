"""Writes of review: campaigns, their state, the annotators' queue (claim, release, skip, judge), gold
answers, and the reviewers' queue (adjudication).

Campaign states go draft → active → closed (draft → closed too) as compare-and-set updates
`UPDATE … WHERE state IN (…)`; whoever loses a race gets IllegalTransition with the fresh state.

The queue needs no row locks. An item is claimed by `UPDATE … SET locked_by=me, locked_until=now+ttl
WHERE id=… AND judgement_count < overlap AND (nobody holds an unexpired lock, or I do)`: of two
annotators racing for one item exactly one updates a row, the other moves on to the next candidate.
A judgement is stored in the same transaction as `UPDATE … SET judgement_count = judgement_count + 1,
locked_by = NULL WHERE … (same condition)`, so an item never gets more than `overlap` judgements and
a judgement never lands on an item someone else holds. One judgement per (item, annotator) is a
unique constraint, so "next" can never hand an annotator an item they judged.

Adjudication: that UPDATE also holds the item's row until commit, so the last judgement of an item sees
every other one and decides, in the same transaction, whether its annotators disagree
(posttrain.review.labels.disagreeing_questions): then `review_state` becomes pending and the item is in
its reviewers' queue. A reviewer claims a pending item with the same lock (annotators never claim a
complete item) and decides it: `UPDATE … SET decision=…, review_state='decided' WHERE review_state IN
(pending, decided) AND (free for the reviewer)`. Gold items are never adjudicated: their answer is known.

Every function takes `now` (default: the current time) so tests can move the clock.

One module per concept:

- `inputs.py`: the checks of a campaign's inputs (texts, bounds, kind, people and their roles, readable inputs);
- `drawing.py`: a campaign's items drawn from its source, the rollouts and gold rows copied, the items made;
- `campaigns.py`: campaigns created (inline or building on a worker), edited, and their state transitions;
- `queue.py`: the annotators' queue (claim, release, skip, judge);
- `gold_answers.py`: gold answers set by the owner;
- `adjudication.py`: the reviewers' queue.
"""

from posttrain.review.services.adjudication import (
    decision_submit,
    item_claim_for_review,
    item_review_release,
    review_items,
)
from posttrain.review.services.campaigns import (
    campaign_activate,
    campaign_build,
    campaign_close,
    campaign_create,
    campaign_update,
)
from posttrain.review.services.drawing import MAX_ITEMS, Draw, source_rollouts
from posttrain.review.services.gold_answers import item_gold_set
from posttrain.review.services.inputs import (
    ANNOTATOR_ROLES,
    MAX_LOCK_TTL_S,
    MAX_OVERLAP,
    MAX_RATING_SPREAD,
    MIN_LOCK_TTL_S,
    NAME_MAX_CHARS,
    REVIEWER_ROLES,
    TEXT_MAX_CHARS,
)
from posttrain.review.services.queue import (
    CLAIM_BATCH,
    MAX_CLAIM_ROUNDS,
    MAX_SECONDS,
    item_claim_next,
    item_release,
    item_skip,
    judgement_submit,
    open_items,
)

__all__ = [
    "ANNOTATOR_ROLES",
    "CLAIM_BATCH",
    "MAX_CLAIM_ROUNDS",
    "MAX_ITEMS",
    "MAX_LOCK_TTL_S",
    "MAX_OVERLAP",
    "MAX_RATING_SPREAD",
    "MAX_SECONDS",
    "MIN_LOCK_TTL_S",
    "NAME_MAX_CHARS",
    "REVIEWER_ROLES",
    "TEXT_MAX_CHARS",
    "Draw",
    "campaign_activate",
    "campaign_build",
    "campaign_close",
    "campaign_create",
    "campaign_update",
    "decision_submit",
    "item_claim_for_review",
    "item_claim_next",
    "item_gold_set",
    "item_release",
    "item_review_release",
    "item_skip",
    "judgement_submit",
    "open_items",
    "review_items",
    "source_rollouts",
]
