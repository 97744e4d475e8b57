"""Annotator review: campaigns over a run's rollout samples, their items, and the judgements on them.

A campaign's state changes only in services, as compare-and-set updates (draft → active → closed).
An item's lock (`locked_by`, `locked_until`) and its `judgement_count` also change only there, in
`UPDATE … WHERE` statements, so two annotators can never both win the same item.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class CampaignState(models.TextChoices):
    DRAFT = "draft"
    ACTIVE = "active"
    CLOSED = "closed"


class CampaignKind(models.TextChoices):
    SINGLE = "single", "One response per item"
    PAIR = "pair", "Two responses to the same prompt per item"


class Campaign(models.Model):
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    instructions = models.TextField(blank=True, help_text="Shown to annotators above every item.")
    kind = models.CharField(max_length=10, choices=CampaignKind.choices, default=CampaignKind.SINGLE)
    questions = models.JSONField(help_text="Validated by posttrain.review.questions; fixed once items exist.")
    source = models.JSONField(help_text="Runs, steps and sampling rule the items were drawn with (normalised).")
    blind = models.BooleanField(default=True, help_text="Hide rewards and run identity from annotators.")
    overlap = models.PositiveIntegerField(default=1, help_text="Annotators who judge each item.")
    lock_ttl_s = models.PositiveIntegerField(default=600, help_text="How long a claimed item stays locked.")
    state = models.CharField(max_length=10, choices=CampaignState.choices, default=CampaignState.DRAFT, db_index=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)
    annotators = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="review_campaigns")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name


class ReviewItem(models.Model):
    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField(help_text="Queue order (shuffled by the source seed).")
    sample_a = models.ForeignKey("runs.Sample", on_delete=models.CASCADE, related_name="+")
    sample_b = models.ForeignKey("runs.Sample", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    display_swap = models.BooleanField(
        default=False, help_text="Pairs: show sample_b as A (position bias); stored answers always mean sample_a/b."
    )
    selection = models.JSONField(default=dict, help_text="Why it was picked: rule, score, step, pairing.")
    judgement_count = models.PositiveIntegerField(default=0, help_text="Kept by judgement_submit; done at `overlap`.")
    locked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    locked_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["campaign", "position"]
        constraints = [models.UniqueConstraint(fields=["campaign", "position"], name="unique_review_item_position")]
        indexes = [models.Index(fields=["campaign", "judgement_count"], name="review_item_open_idx")]

    def __str__(self) -> str:
        return f"{self.campaign_id}#{self.position}"


class Judgement(models.Model):
    """One annotator's answers on one item. Pairwise answers are stored relative to the item's samples
    ("A" = sample_a), whatever order the annotator saw them in."""

    item = models.ForeignKey(ReviewItem, on_delete=models.CASCADE, related_name="judgements")
    annotator = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    answers = models.JSONField()
    seconds = models.FloatField(default=0.0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["item", "created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["item", "annotator"], name="unique_judgement_per_annotator")]


class Skip(models.Model):
    """An annotator put the item off; it comes back to them after their unskipped items."""

    item = models.ForeignKey(ReviewItem, on_delete=models.CASCADE, related_name="skips")
    annotator = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField()

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["item", "annotator"])]
