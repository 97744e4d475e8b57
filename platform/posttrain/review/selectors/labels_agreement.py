"""The items' labels (gold, decisions, weighted votes) and the agreement report before and after
adjudication.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from posttrain.review.agreement import Answered, campaign_agreement
from posttrain.review.labels import GOLD_POLICY_DEFAULTS, GoldCheck, Label, after_adjudication, gold_checks, item_labels
from posttrain.review.models import Campaign, Judgement
from posttrain.review.selectors.progress import campaign_progress


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


@dataclass(frozen=True)
class CampaignLabels:
    """Every item's labels (gold, a reviewer's decision, else the annotators' weighted vote) and the gold
    checks that weighed the annotators (posttrain.review.labels)."""

    policy: dict[str, Any]
    checks: dict[str, GoldCheck]
    labels: dict[int, dict[str, Label]]  # item -> question key -> label

    def weight(self, annotator: str) -> float:
        check = self.checks.get(annotator)
        return 1.0 if check is None else check.weight


def campaign_labels(campaign: Campaign, rows: list[Answered] | None = None) -> CampaignLabels:
    rows = _answered(campaign) if rows is None else rows
    items = list(campaign.items.values_list("pk", "gold", "decision"))
    policy = {**GOLD_POLICY_DEFAULTS, **(campaign.gold_policy or {})}
    checks = gold_checks(campaign.questions, {pk: gold for pk, gold, _ in items if gold}, rows, policy)
    weights = {annotator: check.weight for annotator, check in checks.items()}
    by_item: dict[int, list[Answered]] = defaultdict(list)
    for row in rows:
        by_item[row.item].append(row)
    labels = {
        pk: item_labels(campaign.questions, by_item.get(pk, []), weights, gold=gold, decision=decision)
        for pk, gold, decision in items
    }
    return CampaignLabels(policy, checks, labels)


def agreement(campaign: Campaign) -> dict[str, Any]:
    """The agreement report: per question before adjudication (the annotators' own answers) and after it
    (each decided item's answers replaced by the decision), each annotator's statistics and gold check, and
    the adjudication counts."""
    rows = _answered(campaign)
    decisions: dict[int, dict[str, Any]] = dict(
        campaign.items.filter(decision__isnull=False).values_list("pk", "decision")  # type: ignore[arg-type]
    )
    before = campaign_agreement(campaign.questions, rows)
    after = campaign_agreement(campaign.questions, after_adjudication(rows, decisions))
    labels = campaign_labels(campaign, rows)
    progress = campaign_progress(campaign)
    return {
        "campaign": campaign.pk,
        **before,
        "after_adjudication": {"questions": after["questions"]},
        "adjudication": {"pending": progress["review_pending"], "decided": progress["review_decided"]},
        "gold": {
            "items": progress["gold_items"],
            "policy": labels.policy,
            "annotators": [asdict(check) for check in labels.checks.values()],
        },
    }
