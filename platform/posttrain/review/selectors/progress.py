"""Campaign lists and progress: the campaigns with their counts, the annotator's campaigns, items and
progress, and a campaign's progress per annotator and in adjudication.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db.models import Count, Exists, F, Min, OuterRef, Prefetch, Q, QuerySet, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from posttrain.review.models import Campaign, CampaignState, Judgement, ReviewItem, ReviewState, Skip
from posttrain.review.services import open_items


def campaign_list() -> QuerySet[Campaign]:
    """Campaigns with item_count, items_complete and judgement_total, one query per page."""
    annotators = Prefetch("annotators", queryset=get_user_model().objects.order_by("username"))
    return (
        Campaign.objects.select_related("created_by", "project")
        .prefetch_related(annotators)
        .annotate(
            item_count=Count("items"),
            items_complete=Count("items", filter=Q(items__judgement_count__gte=F("overlap"))),
            judgement_total=Coalesce(Sum("items__judgement_count"), 0),
        )
    )


def annotator_campaigns(user: User) -> QuerySet[Campaign]:
    """The campaigns the user is assigned to (any state): annotators reach nothing else."""
    return Campaign.objects.filter(annotators=user)


def annotator_items(user: User) -> QuerySet[ReviewItem]:
    return ReviewItem.objects.select_related("campaign", "rollout_a__run", "rollout_b__run").filter(
        campaign__annotators=user
    )


def annotator_progress(campaign: Campaign, user: User, now: datetime | None = None) -> dict[str, Any]:
    """judged: items the user judged; remaining: items they may still judge (some may be locked by others
    or skipped); available: of those, claimable now; done: nothing remains."""
    now = now or timezone.now()
    # One aggregate over the user's open items: this runs on every judgement an annotator submits.
    locked = Q(locked_by__isnull=False, locked_until__gt=now)
    counts = open_items(campaign, user).aggregate(
        remaining=Count("pk"),
        locked_by_others=Count("pk", filter=locked & ~Q(locked_by=user)),
        skipped=Count("pk", filter=Q(Exists(Skip.objects.filter(item=OuterRef("pk"), annotator=user)))),
        held=Min("pk", filter=locked & Q(locked_by=user)),
    )
    return {
        "judged": Judgement.objects.filter(item__campaign=campaign, annotator=user).count(),
        "remaining": counts["remaining"],
        "available": counts["remaining"] - counts["locked_by_others"],
        "skipped": counts["skipped"],
        "held_item": counts["held"],
        "done": counts["remaining"] == 0,
    }


def campaign_progress(campaign: Campaign, now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    items = campaign.items.aggregate(
        total=Count("pk"),
        complete=Count("pk", filter=Q(judgement_count__gte=campaign.overlap)),
        judgements=Coalesce(Sum("judgement_count"), 0),
        locked=Count("pk", filter=Q(locked_until__gt=now)),
    )
    judged = dict(
        Judgement.objects.filter(item__campaign=campaign)
        .values("annotator")
        .annotate(n=Count("pk"))
        .values_list("annotator", "n")
    )
    seconds = dict(
        Judgement.objects.filter(item__campaign=campaign)
        .values("annotator")
        .annotate(s=Sum("seconds"))
        .values_list("annotator", "s")
    )
    per_annotator = [
        {
            "annotator": user.get_username(),
            "judged": judged.get(user.pk, 0),
            "seconds": float(seconds.get(user.pk) or 0.0),
            "holding": campaign.items.filter(locked_by=user, locked_until__gt=now).exists(),
        }
        for user in campaign.annotators.order_by("username")
    ]
    needed = items["total"] * campaign.overlap
    review = campaign.items.aggregate(
        pending=Count("pk", filter=Q(review_state=ReviewState.PENDING)),
        decided=Count("pk", filter=Q(review_state=ReviewState.DECIDED)),
        gold=Count("pk", filter=Q(gold__isnull=False)),
    )
    return {
        "items": items["total"],
        "items_complete": items["complete"],
        "items_locked": items["locked"],
        "judgements": items["judgements"],
        "judgements_needed": needed,
        "fraction": items["judgements"] / needed if needed else 0.0,
        "per_annotator": per_annotator,
        "gold_items": review["gold"],
        "review_pending": review["pending"],
        "review_decided": review["decided"],
    }


def annotator_queue(user: User, now: datetime | None = None) -> list[tuple[Campaign, dict[str, Any]]]:
    """The user's active campaigns, each with their progress."""
    campaigns = annotator_campaigns(user).filter(state=CampaignState.ACTIVE).order_by("created_at", "pk")
    return [(campaign, annotator_progress(campaign, user, now)) for campaign in campaigns]
