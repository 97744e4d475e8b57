"""Reads of annotator review: campaign lists with progress, the annotator's view of an item, results
next to the rewards, and the agreement tables.

What an annotator may see is decided here, in `item_for_annotator`, and nowhere else: the prompt, the
reference answer and the response(s) as A/B; in a blind campaign nothing about rewards, reward
components, runs, steps or sample ids; never another annotator's answers.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db.models import Count, F, Prefetch, Q, QuerySet, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from posttrain.review.agreement import Answered, campaign_agreement
from posttrain.review.models import Campaign, CampaignState, Judgement, ReviewItem, Skip
from posttrain.review.questions import swap_pairwise
from posttrain.review.services import open_items
from posttrain.runs.models import Sample

RESULT_ORDERINGS: tuple[str, ...] = (
    "position",
    "-position",
    "disagreement",
    "-disagreement",
    "reward",
    "-reward",
    "judgements",
    "-judgements",
)
# A single item is flagged when the humans' verdict and the reward's standing among the campaign's items
# are at least this far apart on a 0..1 scale (e.g. humans fail it but its reward is in the top half).
SINGLE_DISAGREEMENT_FLAG = 0.5


# --- campaigns and progress ---------------------------------------------------------------------


def campaign_list() -> QuerySet[Campaign]:
    """Campaigns with item_count, items_complete and judgement_total, one query per page."""
    annotators = Prefetch("annotators", queryset=get_user_model().objects.order_by("username"))
    return (
        Campaign.objects.select_related("created_by")
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
    return ReviewItem.objects.select_related("campaign", "sample_a__run", "sample_b__run").filter(
        campaign__annotators=user
    )


def annotator_progress(campaign: Campaign, user: User, now: datetime | None = None) -> dict[str, Any]:
    """judged: items the user judged; remaining: items they may still judge (some may be locked by others
    or skipped); available: of those, claimable now; done: nothing remains."""
    now = now or timezone.now()
    remaining = open_items(campaign, user)
    skipped = Skip.objects.filter(item__in=remaining, annotator=user).values("item").distinct().count()
    locked_by_others = remaining.filter(locked_by__isnull=False, locked_until__gt=now).exclude(locked_by=user).count()
    held = remaining.filter(locked_by=user, locked_until__gt=now).values_list("pk", flat=True).first()
    remaining_count = remaining.count()
    return {
        "judged": Judgement.objects.filter(item__campaign=campaign, annotator=user).count(),
        "remaining": remaining_count,
        "available": remaining_count - locked_by_others,
        "skipped": skipped,
        "held_item": held,
        "done": remaining_count == 0,
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
    return {
        "items": items["total"],
        "items_complete": items["complete"],
        "items_locked": items["locked"],
        "judgements": items["judgements"],
        "judgements_needed": needed,
        "fraction": items["judgements"] / needed if needed else 0.0,
        "per_annotator": per_annotator,
    }


def annotator_queue(user: User, now: datetime | None = None) -> list[tuple[Campaign, dict[str, Any]]]:
    """The user's active campaigns, each with their progress."""
    campaigns = annotator_campaigns(user).filter(state=CampaignState.ACTIVE).order_by("created_at", "pk")
    return [(campaign, annotator_progress(campaign, user, now)) for campaign in campaigns]


# --- what an annotator sees ---------------------------------------------------------------------


def _sample_facts(sample: Sample) -> dict[str, Any]:
    return {
        "id": sample.pk,
        "run": str(sample.run_id),
        "run_name": sample.run.name or str(sample.run_id),
        "step": sample.step,
        "index": sample.index,
        "reward": sample.reward,
        "components": sample.components,
    }


def campaign_for_annotator(campaign: Campaign) -> dict[str, Any]:
    return {
        "id": campaign.pk,
        "name": campaign.name,
        "instructions": campaign.instructions,
        "kind": campaign.kind,
        "blind": campaign.blind,
        "questions": campaign.questions,
    }


def item_for_annotator(item: ReviewItem, user: User) -> dict[str, Any]:
    """The item as the annotator may see it. Pairs show in the item's display order ("A" may be sample_b);
    the user's own earlier answers (only theirs) come back in the same terms."""
    campaign = item.campaign
    shown = (
        [item.sample_a]
        if item.sample_b is None
        else ([item.sample_b, item.sample_a] if item.display_swap else [item.sample_a, item.sample_b])
    )
    responses = []
    for label, sample in zip("AB", shown):
        response: dict[str, Any] = {"label": label, "text": sample.response}
        if not campaign.blind:
            response["sample"] = _sample_facts(sample)
        responses.append(response)
    mine = Judgement.objects.filter(item=item, annotator=user).values_list("answers", flat=True).first()
    return {
        "id": item.pk,
        "campaign": campaign.pk,
        "position": item.position,
        "kind": campaign.kind,
        "prompt": item.sample_a.prompt,
        "reference": item.sample_a.label,
        "responses": responses,
        "locked_until": item.locked_until if item.locked_by_id == user.pk else None,
        "my_answers": None if mine is None else swap_pairwise(campaign.questions, mine, item.display_swap),
    }


# --- researchers: items, results, agreement -----------------------------------------------------


def campaign_items(campaign: Campaign) -> QuerySet[ReviewItem]:
    return (
        campaign.items.select_related("sample_a__run", "sample_b__run", "locked_by")
        .annotate(skip_count=Count("skips"))
        .order_by("position")
    )


def _answered(campaign: Campaign) -> list[Answered]:
    rows = (
        Judgement.objects.filter(item__campaign=campaign)
        .select_related("annotator")
        .order_by("item__position", "annotator__username")
    )
    return [
        Answered(item=j.item_id, annotator=j.annotator.get_username(), answers=j.answers, seconds=j.seconds)
        for j in rows
    ]


def agreement(campaign: Campaign) -> dict[str, Any]:
    return {"campaign": campaign.pk, **campaign_agreement(campaign.questions, _answered(campaign))}


def _plurality(values: list[Any]) -> Any:
    ranked = Counter(values).most_common(2)
    if not ranked or (len(ranked) == 2 and ranked[0][1] == ranked[1][1]):
        return None
    return ranked[0][0]


def pairwise_majority(answers: list[Any]) -> Any:
    """The humans' answer to a pairwise question: the strict plurality of the stored answers ("A" = sample_a,
    "B", "tie", "both_bad"), None when the top answers are level or nobody answered."""
    return _plurality([a for a in answers if a is not None])


def _question_summary(question: dict[str, Any], values: list[Any]) -> dict[str, Any] | None:
    kind = question["kind"]
    if kind == "pass_fail":
        return {"n": len(values), "pass_rate": sum(values) / len(values) if values else None}
    if kind == "rating":
        return {"n": len(values), "mean": sum(values) / len(values) if values else None}
    if kind == "pairwise":
        counts = Counter(values)
        return {
            "n": len(values),
            "counts": {c: counts.get(c, 0) for c in question["choices"]},
            "majority": pairwise_majority(values),
        }
    if kind == "tags":
        counts = Counter(tag for chosen in values for tag in chosen)
        return {"n": len(values), "counts": {tag: counts.get(tag, 0) for tag in question["options"]}}
    return None


def _human_score(questions: list[dict[str, Any]], summary: dict[str, Any]) -> float | None:
    """The humans' verdict on a single item on 0..1: the pass rate of the first pass/fail question, else the
    mean of the first rating question scaled to its range."""
    for question in questions:
        entry = summary.get(question["key"])
        if question["kind"] == "pass_fail" and entry and entry["pass_rate"] is not None:
            return entry["pass_rate"]
    for question in questions:
        entry = summary.get(question["key"])
        if question["kind"] == "rating" and entry and entry["mean"] is not None:
            return (entry["mean"] - question["min"]) / (question["max"] - question["min"])
    return None


def _reward_ranks(rewards: list[float]) -> dict[float, float]:
    """Each reward's standing among the campaign's rewards on 0..1 (mean rank of ties / (n − 1))."""
    ordered = sorted(rewards)
    if len(ordered) == 1:
        return {ordered[0]: 0.5}
    ranks: dict[float, float] = {}
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[i]:
            j += 1
        ranks[ordered[i]] = ((i + j) / 2) / (len(ordered) - 1)
        i = j + 1
    return ranks


def _result_sample(sample: Sample) -> dict[str, Any]:
    return {**_sample_facts(sample), "response": sample.response, "label": sample.label}


def campaign_results(
    campaign: Campaign, *, ordering: str = "position", disagreements_only: bool = False
) -> list[dict[str, Any]]:
    """Per item: the samples with their rewards and components, every judgement, a per-question summary,
    and whether the humans disagree with the reward.

    Pairs: `reward_preferred` is the sample with the higher reward ("A" = sample_a, "tie" when equal),
    `human_preferred` the plurality answer of the first pairwise question; they disagree when both name a
    different sample. Singles: `human_score` (see _human_score) against `reward_rank`, the reward's standing
    among the campaign's items; `disagreement` = |human_score − reward_rank|, flagged from 0.5."""
    questions = campaign.questions
    items = list(campaign.items.select_related("sample_a__run", "sample_b__run").order_by("position"))
    judgements: dict[int, list[Judgement]] = {}
    for judgement in (
        Judgement.objects.filter(item__campaign=campaign).select_related("annotator").order_by("annotator__username")
    ):
        judgements.setdefault(judgement.item_id, []).append(judgement)
    ranks = _reward_ranks([i.sample_a.reward for i in items if i.sample_b is None and i.sample_a.reward is not None])
    first_pairwise = next((q["key"] for q in questions if q["kind"] == "pairwise"), None)
    results = []
    for item in items:
        mine = judgements.get(item.pk, [])
        summary = {}
        for question in questions:
            entry = _question_summary(
                question, [j.answers[question["key"]] for j in mine if j.answers.get(question["key"]) is not None]
            )
            if entry is not None:
                summary[question["key"]] = entry
        row: dict[str, Any] = {
            "item": item.pk,
            "position": item.position,
            "selection": item.selection,
            "prompt": item.sample_a.prompt,
            "samples": {"A": _result_sample(item.sample_a)},
            "judgement_count": item.judgement_count,
            "complete": item.judgement_count >= campaign.overlap,
            "judgements": [
                {
                    "annotator": j.annotator.get_username(),
                    "answers": j.answers,
                    "seconds": j.seconds,
                    "updated_at": j.updated_at,
                }
                for j in mine
            ],
            "summary": summary,
        }
        if item.sample_b is not None:
            row["samples"]["B"] = _result_sample(item.sample_b)
            reward_a, reward_b = item.sample_a.reward, item.sample_b.reward
            reward_preferred = (
                None
                if reward_a is None or reward_b is None
                else ("A" if reward_a > reward_b else "B" if reward_b > reward_a else "tie")
            )
            human = summary[first_pairwise]["majority"] if first_pairwise else None
            both_pick = reward_preferred in ("A", "B") and human in ("A", "B")
            row.update(
                {
                    "reward_preferred": reward_preferred,
                    "human_preferred": human,
                    "disagreement": (1.0 if reward_preferred != human else 0.0) if both_pick else None,
                }
            )
        else:
            human_score = _human_score(questions, summary)
            reward = item.sample_a.reward
            reward_rank = ranks.get(reward) if reward is not None else None
            row.update(
                {
                    "human_score": human_score,
                    "reward_rank": reward_rank,
                    "disagreement": None
                    if human_score is None or reward_rank is None
                    else abs(human_score - reward_rank),
                }
            )
        row["disagrees"] = row["disagreement"] is not None and row["disagreement"] >= SINGLE_DISAGREEMENT_FLAG
        results.append(row)
    if disagreements_only:
        results = [row for row in results if row["disagrees"]]
    return _sorted_results(results, ordering)


def _sorted_results(results: list[dict[str, Any]], ordering: str) -> list[dict[str, Any]]:
    descending = ordering.startswith("-")
    field = ordering.lstrip("-")
    value = {
        "position": lambda r: r["position"],
        "disagreement": lambda r: r["disagreement"],
        "reward": lambda r: r["samples"]["A"]["reward"],
        "judgements": lambda r: r["judgement_count"],
    }[field]
    known = [r for r in results if value(r) is not None]
    unknown = [r for r in results if value(r) is None]  # always last, whichever direction
    known.sort(key=lambda r: r["position"])
    known.sort(key=value, reverse=descending)  # stable either way: equal values stay in queue order
    return known + unknown
