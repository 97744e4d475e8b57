"""Writes of annotator review: campaigns, their state, and the queue (claim, release, skip, judge).

Campaign states go draft → active → closed (draft → closed too) as compare-and-set updates
`UPDATE … WHERE state IN (…)`; whoever loses a race gets IllegalTransition with the fresh state.

The queue needs no row locks. An item is claimed by `UPDATE … SET locked_by=me, locked_until=now+ttl
WHERE id=… AND judgement_count < overlap AND (nobody holds an unexpired lock, or I do)`: of two
annotators racing for one item exactly one updates a row, the other moves on to the next candidate.
A judgement is stored in the same transaction as `UPDATE … SET judgement_count = judgement_count + 1,
locked_by = NULL WHERE … (same condition)`, so an item never gets more than `overlap` judgements and
a judgement never lands on an item someone else holds. One judgement per (item, annotator) is a
unique constraint, so "next" can never hand an annotator an item they judged.

Every function takes `now` (default: the current time) so tests can move the clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from posttrain.accounts.roles import Role
from posttrain.accounts.selectors import user_roles
from posttrain.core.errors import IllegalTransition, InvalidInput, ItemUnavailable, NotAssigned
from posttrain.review.models import Campaign, CampaignKind, CampaignState, Judgement, ReviewItem, Skip
from posttrain.review.questions import swap_pairwise, validate_answers, validate_questions
from posttrain.review.sampling import Candidate, queue_order, select, validate_source
from posttrain.runs.models import Run, Sample

NAME_MAX_CHARS = 200
TEXT_MAX_CHARS = 20_000
MAX_ITEMS = 5000
MAX_OVERLAP = 20
MIN_LOCK_TTL_S = 30
MAX_LOCK_TTL_S = 24 * 3600
MAX_SECONDS = 24 * 3600.0
CLAIM_BATCH = 20
MAX_CLAIM_ROUNDS = 50
ANNOTATOR_ROLES = frozenset({Role.ANNOTATOR, Role.ADMIN})


# =============================================================================================
# Campaigns
# =============================================================================================


def _collect(errors: list[dict[str, str]], check, *args: Any) -> Any:
    """Run one validation, keeping its field errors so the caller reports all of them at once."""
    try:
        return check(*args)
    except InvalidInput as exc:
        errors.extend(exc.errors)
        return None


def _clean_text(value: Any, loc: str, *, limit: int, required: bool = False) -> str:
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise InvalidInput.one(loc, "must be a string")
    value = value.strip()
    if required and not value:
        raise InvalidInput.one(loc, "is required")
    if len(value) > limit:
        raise InvalidInput.one(loc, f"is {len(value)} characters long; at most {limit}")
    if "\x00" in value:
        raise InvalidInput.one(loc, "must not contain NUL characters")
    return value


def _bounded_int(value: Any, loc: str, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput.one(loc, f"must be an integer from {low} to {high} ({what})")
    return value


def _check_kind(kind: Any) -> str:
    if kind not in CampaignKind.values:
        raise InvalidInput.one("kind", f"must be one of {', '.join(CampaignKind.values)}, got {kind!r}"[:300])
    return kind


def _check_annotators(users: Sequence[User]) -> list[User]:
    errors = []
    for i, user in enumerate(users):
        if not user_roles(user) & ANNOTATOR_ROLES:
            errors.append(
                {"loc": f"annotators[{i}]", "msg": f"{user.get_username()!r} does not have the annotator role"}
            )
    if errors:
        raise InvalidInput(errors)
    return list({user.pk: user for user in users}.values())


def _check_runs(run_ids: list[str]) -> None:
    found = {str(pk) for pk in Run.objects.filter(pk__in=run_ids).values_list("pk", flat=True)}
    missing = [
        {"loc": f"source.runs[{i}]", "msg": f"no run with id {run_id}"}
        for i, run_id in enumerate(run_ids)
        if run_id not in found
    ]
    if missing:
        raise InvalidInput(missing)


def _candidates(source: dict[str, Any], kind: str) -> list[Candidate]:
    samples = Sample.objects.filter(run_id__in=source["runs"])
    if source["steps"] is not None:
        samples = samples.filter(step__in=source["steps"])
    elif source["step_range"] is not None:
        samples = samples.filter(step__gte=source["step_range"][0], step__lte=source["step_range"][1])
    fields = ["id", "run_id", "step", "index", "group", "reward", "components"]
    if kind == CampaignKind.PAIR:  # pairing compares prompt and response texts; singles never load them
        fields += ["prompt", "response"]
    candidates = []
    for row in samples.values(*fields).iterator(chunk_size=2000):
        row["run_id"] = str(row["run_id"])
        if not isinstance(row["components"], dict):
            row["components"] = {}
        candidates.append(Candidate(**row))
    return candidates


def _nothing_selected(source: dict[str, Any], kind: str) -> str:
    if kind == CampaignKind.PAIR and len(source["runs"]) == 2:
        return "selects no items: the two runs have no prompt in common at these steps with different responses"
    if kind == CampaignKind.PAIR:
        return "selects no items: no prompt group at these steps has two different responses"
    if source["rule"] in ("component_disagreement", "reward_vs_component"):
        return (
            f"selects no items: no sample at these steps has a finite reward and the components "
            f"{', '.join(source['components'])}"
        )
    return "selects no items: the runs have no samples at these steps (with a reward, for the reward rules)"


def campaign_create(
    *,
    name: str,
    kind: str,
    questions: Any,
    source: Any,
    description: str = "",
    instructions: str = "",
    blind: bool = True,
    overlap: int = 1,
    lock_ttl_s: int = 600,
    annotators: Sequence[User] = (),
    user: User | None = None,
) -> Campaign:
    """A draft campaign with its items sampled from the runs (deterministic by the source's seed)."""
    errors: list[dict[str, str]] = []
    name = _collect(errors, lambda: _clean_text(name, "name", limit=NAME_MAX_CHARS, required=True))
    description = _collect(errors, lambda: _clean_text(description, "description", limit=TEXT_MAX_CHARS))
    instructions = _collect(errors, lambda: _clean_text(instructions, "instructions", limit=TEXT_MAX_CHARS))
    if not isinstance(blind, bool):
        errors.append({"loc": "blind", "msg": "must be true or false"})
    _collect(errors, _bounded_int, overlap, "overlap", 1, MAX_OVERLAP, "annotators per item")
    _collect(errors, _bounded_int, lock_ttl_s, "lock_ttl_s", MIN_LOCK_TTL_S, MAX_LOCK_TTL_S, "seconds")
    annotators = _collect(errors, _check_annotators, annotators)
    kind = _collect(errors, _check_kind, kind)
    if kind is not None:
        questions = _collect(errors, validate_questions, questions, kind)
        source = _collect(errors, validate_source, source, kind)
        if source is not None:
            _collect(errors, _check_runs, source["runs"])
    if errors:
        raise InvalidInput(errors)

    picks = select(_candidates(source, kind), source, kind)
    if not picks:
        raise InvalidInput.one("source", _nothing_selected(source, kind))
    if len(picks) > MAX_ITEMS:
        raise InvalidInput.one(
            "source.k", f"selects {len(picks)} items; at most {MAX_ITEMS} per campaign: lower k or choose fewer steps"
        )
    with transaction.atomic():
        campaign = Campaign.objects.create(
            name=name,
            description=description,
            instructions=instructions,
            kind=kind,
            questions=questions,
            source=source,
            blind=blind,
            overlap=overlap,
            lock_ttl_s=lock_ttl_s,
            created_by=user if user is not None and user.is_authenticated else None,
        )
        campaign.annotators.set(annotators)
        ReviewItem.objects.bulk_create(
            [
                ReviewItem(
                    campaign=campaign,
                    position=position,
                    sample_a_id=pick.sample_a,
                    sample_b_id=pick.sample_b,
                    display_swap=swap,
                    selection=pick.selection,
                )
                for position, (pick, swap) in enumerate(queue_order(picks, source["seed"]))
            ],
            batch_size=1000,
        )
    return campaign


def campaign_update(
    campaign: Campaign,
    *,
    name: str | None = None,
    description: str | None = None,
    instructions: str | None = None,
    annotators: Sequence[User] | None = None,
) -> Campaign:
    """Edit the texts and who annotates. Questions and source are fixed: the items were drawn from them."""
    fields = []
    if name is not None:
        campaign.name = _clean_text(name, "name", limit=NAME_MAX_CHARS, required=True)
        fields.append("name")
    if description is not None:
        campaign.description = _clean_text(description, "description", limit=TEXT_MAX_CHARS)
        fields.append("description")
    if instructions is not None:
        campaign.instructions = _clean_text(instructions, "instructions", limit=TEXT_MAX_CHARS)
        fields.append("instructions")
    with transaction.atomic():
        if annotators is not None:
            annotators = _check_annotators(annotators)
            if campaign.state == CampaignState.ACTIVE and len(annotators) < campaign.overlap:
                raise InvalidInput.one(
                    "annotators",
                    f"an active campaign with overlap {campaign.overlap} needs at least {campaign.overlap} annotators",
                )
            campaign.annotators.set(annotators)
        if fields:
            campaign.save(update_fields=fields)
    return campaign


def _transition(
    campaign: Campaign, allowed_from: Sequence[str], to_state: str, verb: str, now: datetime | None
) -> Campaign:
    updated = Campaign.objects.filter(pk=campaign.pk, state__in=allowed_from).update(
        state=to_state, state_changed_at=now or timezone.now()
    )
    campaign.refresh_from_db(fields=["state", "state_changed_at"])
    if not updated:
        raise IllegalTransition(f"cannot {verb} a campaign that is {campaign.state}", campaign.state)
    return campaign


def campaign_activate(campaign: Campaign, *, now: datetime | None = None) -> Campaign:
    """Open the queue to the annotators (draft → active)."""
    assigned = campaign.annotators.count()
    if campaign.state == CampaignState.DRAFT and assigned < campaign.overlap:
        raise IllegalTransition(
            f"assign at least {campaign.overlap} annotator(s) (the overlap) before activating; {assigned} assigned",
            campaign.state,
        )
    return _transition(campaign, [CampaignState.DRAFT], CampaignState.ACTIVE, "activate", now)


def campaign_close(campaign: Campaign, *, now: datetime | None = None) -> Campaign:
    """Stop the work (draft or active → closed); judgements stay for results and export."""
    return _transition(campaign, [CampaignState.DRAFT, CampaignState.ACTIVE], CampaignState.CLOSED, "close", now)


# =============================================================================================
# The queue
# =============================================================================================


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
    return ReviewItem.objects.select_related("campaign", "sample_a__run", "sample_b__run").get(pk=pk)


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
    shown = validate_answers(campaign.questions, answers)
    seconds = _check_seconds(seconds)
    stored = swap_pairwise(campaign.questions, shown, item.display_swap)
    try:
        with transaction.atomic():
            existing = Judgement.objects.select_for_update().filter(item=item, annotator=user).first()
            if existing is not None:
                existing.answers = stored
                existing.seconds += seconds
                existing.save(update_fields=["answers", "seconds", "updated_at"])
                return existing, False
            taken = (
                ReviewItem.objects.filter(pk=item.pk, judgement_count__lt=campaign.overlap)
                .filter(_free_for(user, now))
                .update(judgement_count=F("judgement_count") + 1, locked_by=None, locked_until=None)
            )
            if not taken:
                raise _why_unavailable(item.pk, campaign, now)
            return Judgement.objects.create(item=item, annotator=user, answers=stored, seconds=seconds), True
    except IntegrityError:  # the same user's concurrent submission won; this one changed nothing
        raise ItemUnavailable("you have judged this item already") from None


def _why_unavailable(pk: int, campaign: Campaign, now: datetime) -> ItemUnavailable:
    fresh = ReviewItem.objects.get(pk=pk)
    if fresh.judgement_count >= campaign.overlap:
        return ItemUnavailable(f"the item has all its {campaign.overlap} judgement(s) already")
    # Released since the claim failed (locked_until cleared): held, but no longer until a known time.
    until = f" until {fresh.locked_until.isoformat()}" if fresh.locked_until is not None else ""
    return ItemUnavailable(f"another annotator holds this item{until}")
