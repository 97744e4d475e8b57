"""Campaigns: created (inline, or building on a worker), edited, and their state (draft → active →
closed) as compare-and-set updates.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from posttrain.core.errors import IllegalTransition, InvalidInput
from posttrain.core.task_queue import task_send
from posttrain.projects.models import Project
from posttrain.review.gold import validate_gold_spec
from posttrain.review.labels import validate_gold_policy
from posttrain.review.models import Campaign, CampaignState
from posttrain.review.questions import validate_questions
from posttrain.review.sampling import validate_source
from posttrain.review.services.drawing import _draw, _make_items, source_rollouts
from posttrain.review.services.inputs import (
    MAX_LOCK_TTL_S,
    MAX_OVERLAP,
    MAX_RATING_SPREAD,
    MIN_LOCK_TTL_S,
    NAME_MAX_CHARS,
    TEXT_MAX_CHARS,
    _alert_pointers,
    _bounded_int,
    _check_annotators,
    _check_kind,
    _check_readable_inputs,
    _check_reviewers,
    _check_runs,
    _clean_text,
    _collect,
)
from posttrain.telemetry.rollouts import gaps_payload


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
    reviewers: Sequence[User] = (),
    review_rating_spread: int = 2,
    gold: Any = None,
    gold_policy: Any = None,
    show_suggestions: bool = False,
    project: Project,
    user: User | None = None,
) -> Campaign:
    """A draft campaign in `project` with its items sampled from the runs (deterministic by the source's seed),
    each showing its own copy of its rollouts, and the gold rows mixed in (posttrain.review.gold). The runs, the
    judge pool and the gold dataset are ones `user` reads (the caller checked they create in `project`)."""
    errors: list[dict[str, str]] = []
    name = _collect(errors, lambda: _clean_text(name, "name", limit=NAME_MAX_CHARS, required=True))
    description = _collect(errors, lambda: _clean_text(description, "description", limit=TEXT_MAX_CHARS))
    instructions = _collect(errors, lambda: _clean_text(instructions, "instructions", limit=TEXT_MAX_CHARS))
    for field, flag in (("blind", blind), ("show_suggestions", show_suggestions)):
        if not isinstance(flag, bool):
            errors.append({"loc": field, "msg": "must be true or false"})
    _collect(errors, _bounded_int, overlap, "overlap", 1, MAX_OVERLAP, "annotators per item")
    _collect(errors, _bounded_int, lock_ttl_s, "lock_ttl_s", MIN_LOCK_TTL_S, MAX_LOCK_TTL_S, "seconds")
    _collect(errors, _bounded_int, review_rating_spread, "review_rating_spread", 1, MAX_RATING_SPREAD, "rating points")
    annotators = _collect(errors, _check_annotators, annotators)
    reviewers = _collect(errors, _check_reviewers, reviewers)
    gold_policy = _collect(errors, validate_gold_policy, gold_policy)
    kind = _collect(errors, _check_kind, kind)
    if kind is not None:
        questions = _collect(errors, validate_questions, questions, kind)
        source = _collect(errors, validate_source, source, kind)
        if source is not None:
            _collect(errors, _check_runs, source["runs"], user)
        if questions is not None and isinstance(blind, bool):
            gold = _collect(errors, validate_gold_spec, gold, kind, questions, blind)
    if errors:
        raise InvalidInput(errors)
    _check_readable_inputs(source, gold, user)

    if source["rule"] == "alerts" and source["alerts"] is None:
        source["alerts"] = _alert_pointers(source)
    fields = {
        "project": project,
        "name": name,
        "description": description,
        "instructions": instructions,
        "kind": kind,
        "questions": questions,
        "source": source,
        "blind": blind,
        "overlap": overlap,
        "lock_ttl_s": lock_ttl_s,
        "review_rating_spread": review_rating_spread,
        "gold_spec": gold,
        "gold_policy": gold_policy,
        "show_suggestions": show_suggestions,
        "created_by": user if user is not None and user.is_authenticated else None,
    }
    if source_rollouts(source) > settings.REVIEW_CAMPAIGN_INLINE_MAX_ROLLOUTS:
        return _campaign_queue_build(fields, annotators, reviewers)
    draw = _draw(source, kind, questions, gold)
    with transaction.atomic():
        campaign = Campaign.objects.create(**fields, gaps=gaps_payload(draw.gaps, with_run=True))
        campaign.annotators.set(annotators)
        campaign.reviewers.set(reviewers)
        _make_items(campaign, draw)
    return campaign


def _campaign_queue_build(fields: dict[str, Any], annotators: Sequence[User], reviewers: Sequence[User]) -> Campaign:
    """A campaign over more rollouts than a request should read: created building, its items drawn by the
    task `workers.review_campaign_build` (campaign_build) after commit, on the default queue."""
    with transaction.atomic():
        campaign = Campaign.objects.create(**fields, state=CampaignState.BUILDING)
        campaign.annotators.set(annotators)
        campaign.reviewers.set(reviewers)
        transaction.on_commit(lambda: task_send("review_campaign_build", str(campaign.pk)))
    return campaign


def campaign_build(campaign_id: Any) -> None:
    """A worker draws a building campaign's items: building → draft with its items, or → failed with the
    reason (what the request would have answered: none selected, too many, a gold dataset unreadable).
    Idempotent: a campaign no longer building is left alone, and the items are made under its row lock."""
    campaign = Campaign.objects.filter(pk=campaign_id, state=CampaignState.BUILDING).first()
    if campaign is None:
        return
    try:
        draw = _draw(campaign.source, campaign.kind, campaign.questions, campaign.gold_spec)
    except InvalidInput as refused:
        _build_failed(campaign, "; ".join(f"{e['loc']}: {e['msg']}" if e["loc"] else e["msg"] for e in refused.errors))
        return
    except Exception as exc:
        _build_failed(campaign, f"{type(exc).__name__}: {exc}")
        raise
    with transaction.atomic():
        if not Campaign.objects.select_for_update().filter(pk=campaign.pk, state=CampaignState.BUILDING).exists():
            return  # closed meanwhile, or built by another worker
        _make_items(campaign, draw)
        Campaign.objects.filter(pk=campaign.pk).update(
            state=CampaignState.DRAFT, state_changed_at=timezone.now(), gaps=gaps_payload(draw.gaps, with_run=True)
        )


def _build_failed(campaign: Campaign, reason: str) -> None:
    Campaign.objects.filter(pk=campaign.pk, state=CampaignState.BUILDING).update(
        state=CampaignState.FAILED, state_changed_at=timezone.now(), build_error=reason[:2000]
    )


def campaign_update(
    campaign: Campaign,
    *,
    name: str | None = None,
    description: str | None = None,
    instructions: str | None = None,
    annotators: Sequence[User] | None = None,
    reviewers: Sequence[User] | None = None,
    gold_policy: Any = None,
    show_suggestions: bool | None = None,
    review_rating_spread: int | None = None,
) -> Campaign:
    """Edit the texts, who annotates and reviews, how gold weighs judgements and whether annotators see a
    judge's suggestions. Questions and source are fixed: the items were drawn from them. A new rating
    spread applies to items completed from now on."""
    fields = _set_settings(campaign, gold_policy, show_suggestions, review_rating_spread)
    fields += _set_texts(campaign, name, description, instructions)
    with transaction.atomic():
        if annotators is not None:
            annotators = _check_annotators(annotators)
            if campaign.state == CampaignState.ACTIVE and len(annotators) < campaign.overlap:
                raise InvalidInput.one(
                    "annotators",
                    f"an active campaign with overlap {campaign.overlap} needs at least {campaign.overlap} annotators",
                )
            campaign.annotators.set(annotators)
        if reviewers is not None:
            campaign.reviewers.set(_check_reviewers(reviewers))
        if fields:
            campaign.save(update_fields=fields)
    return campaign


def _set_settings(
    campaign: Campaign, gold_policy: Any, show_suggestions: bool | None, review_rating_spread: int | None
) -> list[str]:
    """Set the given settings on the campaign (not saved), each checked; the names of the fields set."""
    fields = []
    if gold_policy is not None:
        campaign.gold_policy = validate_gold_policy(gold_policy)
        fields.append("gold_policy")
    if show_suggestions is not None:
        if not isinstance(show_suggestions, bool):
            raise InvalidInput.one("show_suggestions", "must be true or false")
        campaign.show_suggestions = show_suggestions
        fields.append("show_suggestions")
    if review_rating_spread is not None:
        campaign.review_rating_spread = _bounded_int(
            review_rating_spread, "review_rating_spread", 1, MAX_RATING_SPREAD, "rating points"
        )
        fields.append("review_rating_spread")
    return fields


def _set_texts(campaign: Campaign, name: str | None, description: str | None, instructions: str | None) -> list[str]:
    """Set the given texts on the campaign (not saved), cleaned; the names of the fields set."""
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
    return fields


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
    """Stop the work (draft or active → closed; a building or failed campaign too); judgements stay for
    results and export."""
    return _transition(
        campaign,
        [CampaignState.DRAFT, CampaignState.ACTIVE, CampaignState.BUILDING, CampaignState.FAILED],
        CampaignState.CLOSED,
        "close",
        now,
    )
