"""Annotator review: campaigns over runs' rollouts, their items, the judgements on them, the reviewers'
decisions, and judges (registered rewards) that pre-score the items.

A campaign's state changes only in services, as compare-and-set updates (draft → active → closed; a large
campaign starts building, and becomes a draft, or failed, once a worker drew its items).
An item's lock (`locked_by`, `locked_until`), its `judgement_count` and its `review_state` also change
only there, in `UPDATE … WHERE` statements, so two annotators (or two reviewers) can never both win the
same item. A judge run changes state the same way (queued → running → done | failed).

An item shows its own copy of the rollouts (`ReviewRollout`), with a reference to where each came from
(run, step, index): a campaign keeps what its annotators saw whatever happens to the run's rollouts.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from posttrain.core.worker_jobs import WorkerJob, WorkerJobState
from posttrain.projects.models import default_project_id


class CampaignState(models.TextChoices):
    BUILDING = "building"  # a large campaign's items are being drawn on a worker
    FAILED = "failed"  # its items could not be drawn (`build_error` says why)
    DRAFT = "draft"
    ACTIVE = "active"
    CLOSED = "closed"


class CampaignKind(models.TextChoices):
    SINGLE = "single", "One response per item"
    PAIR = "pair", "Two responses to the same prompt per item"


class Campaign(models.Model):
    project = models.ForeignKey(
        "projects.Project", on_delete=models.PROTECT, default=default_project_id, related_name="+"
    )
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    instructions = models.TextField(blank=True, help_text="Markdown, shown to annotators beside every item.")
    kind = models.CharField(max_length=10, choices=CampaignKind.choices, default=CampaignKind.SINGLE)
    questions = models.JSONField(help_text="Validated by posttrain.review.questions; fixed once items exist.")
    source = models.JSONField(help_text="Runs, steps and sampling rule the items were drawn with (normalised).")
    blind = models.BooleanField(default=True, help_text="Hide rewards and run identity from annotators.")
    overlap = models.PositiveIntegerField(default=1, help_text="Annotators who judge each item.")
    lock_ttl_s = models.PositiveIntegerField(default=600, help_text="How long a claimed item stays locked.")
    state = models.CharField(max_length=10, choices=CampaignState.choices, default=CampaignState.DRAFT, db_index=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)
    annotators = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="review_campaigns")
    reviewers = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="adjudicated_campaigns", help_text="Who adjudicates."
    )
    review_rating_spread = models.PositiveIntegerField(
        default=2, help_text="Ratings this many points apart (or more) send a complete item to the reviewers."
    )
    gold_spec = models.JSONField(
        null=True, blank=True, help_text="Gold items drawn from a dataset at creation (normalised), if any."
    )
    gold_policy = models.JSONField(
        default=dict, help_text="How gold accuracy weighs judgements: min_accuracy, min_items, weighting."
    )
    show_suggestions = models.BooleanField(
        default=False, help_text="Show annotators the latest judge run's pre-labels (else they judge blind)."
    )
    build_error = models.TextField(blank=True, help_text="Why a campaign built on a worker failed.")
    gaps = models.JSONField(
        default=list,
        blank=True,
        help_text="Rollout files the items could not be drawn from (missing, unreadable): [{run, step, file, reason}].",
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name


class ReviewRollout(models.Model):
    """The copy of one rollout that an item shows, and where it came from: (run, step, index) of a run, or a
    row of a gold dataset. Copied at campaign creation through posttrain.telemetry.selectors.rollouts_query."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="rollouts")
    run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    step = models.IntegerField(null=True, blank=True)
    index = models.IntegerField(null=True, blank=True)
    group = models.IntegerField(default=0)
    prompt = models.TextField()
    response = models.TextField()
    label = models.TextField(null=True, blank=True, help_text="The dataset's reference answer, if any.")
    reward = models.FloatField(null=True, blank=True)
    components = models.JSONField(default=dict, blank=True)
    finish_reason = models.CharField(max_length=20, blank=True)
    tokens = models.JSONField(default=dict, blank=True, help_text="The per-token view, when the step had one.")
    turns = models.JSONField(
        default=list, blank=True, help_text="A multi-turn episode's turns ([{role, text, reward}]); [] for one turn."
    )
    dataset = models.ForeignKey("registry.Dataset", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    dataset_row = models.IntegerField(null=True, blank=True, help_text="Gold rows: the dataset row (0-based).")

    class Meta:
        ordering = ["campaign", "run", "step", "index"]

    def __str__(self) -> str:
        where = f"row {self.dataset_row}" if self.run_id is None else f"{self.run_id} step {self.step} #{self.index}"
        return f"{self.campaign_id}: {where}"


class ReviewState(models.TextChoices):
    NONE = "", "No review needed"
    PENDING = "pending", "Annotators disagree: waiting for a reviewer"
    DECIDED = "decided", "A reviewer decided"


class GoldSource(models.TextChoices):
    NONE = "", "Not gold"
    OWNER = "owner", "Set by the campaign's owner"
    DATASET = "dataset", "A row of a gold dataset"


class ReviewItem(models.Model):
    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField(help_text="Queue order (shuffled by the source seed).")
    rollout_a = models.ForeignKey(ReviewRollout, on_delete=models.CASCADE, related_name="+")
    rollout_b = models.ForeignKey(ReviewRollout, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    display_swap = models.BooleanField(
        default=False, help_text="Pairs: show rollout_b as A (position bias); stored answers always mean rollout_a/b."
    )
    selection = models.JSONField(default=dict, help_text="Why it was picked: rule, score, step, pairing.")
    judgement_count = models.PositiveIntegerField(default=0, help_text="Kept by judgement_submit; done at `overlap`.")
    locked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    locked_until = models.DateTimeField(null=True, blank=True)
    gold = models.JSONField(null=True, blank=True, help_text="Known answers (question key -> answer, as stored).")
    gold_source = models.CharField(max_length=10, choices=GoldSource.choices, blank=True, default=GoldSource.NONE)
    review_state = models.CharField(
        max_length=10, choices=ReviewState.choices, blank=True, default=ReviewState.NONE, db_index=True
    )
    decision = models.JSONField(null=True, blank=True, help_text="The reviewer's answers: the item's label.")
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["campaign", "position"]
        constraints = [models.UniqueConstraint(fields=["campaign", "position"], name="unique_review_item_position")]
        indexes = [
            models.Index(fields=["campaign", "judgement_count"], name="review_item_open_idx"),
            models.Index(fields=["campaign", "review_state"], name="review_item_review_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.campaign_id}#{self.position}"


class Judgement(models.Model):
    """One annotator's answers on one item. Pairwise answers are stored relative to the item's rollouts
    ("A" = rollout_a), whatever order the annotator saw them in."""

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


JudgeRunState = WorkerJobState  # the states every worker job has


class JudgeRun(WorkerJob):
    """A registered reward scoring rollouts on a Celery worker (never in the web process), recorded with
    its lifecycle: a campaign's items (pre-labels, and the judge's agreement with the humans), or a pool of
    runs' rollouts (`source`) that a new campaign then picks from where the reward and the judge disagree."""

    task_name = "review_judge_run"
    result_fields = ("scored", "failed_samples")
    soft_limit_setting = "USER_CODE_LONG_SOFT_TIME_LIMIT_S"
    hard_limit_setting = "USER_CODE_LONG_TIME_LIMIT_S"

    project = models.ForeignKey(
        "projects.Project", on_delete=models.PROTECT, default=default_project_id, related_name="+"
    )
    campaign = models.ForeignKey(Campaign, null=True, blank=True, on_delete=models.CASCADE, related_name="judge_runs")
    source = models.JSONField(null=True, blank=True, help_text="A pool: runs and steps (normalised).")
    reward = models.ForeignKey(
        "registry.RewardFunction", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reward_name = models.CharField(max_length=200, help_text="Kept when the reward is deleted.")
    spec = models.JSONField(help_text="The reward spec the worker scored with (a copy).")
    threshold = models.FloatField(default=0.5, help_text="A score at or above it is a pass.")
    score_min = models.FloatField(default=0.0, help_text="Ratings: the score mapped to the scale's lowest point.")
    score_max = models.FloatField(default=1.0, help_text="Ratings: the score mapped to the scale's highest point.")
    total = models.PositiveIntegerField(default=0, help_text="Rollouts to score.")
    scored = models.PositiveIntegerField(default=0, help_text="Rollouts scored so far.")
    failed_samples = models.PositiveIntegerField(default=0, help_text="Rollouts the reward reported errors for.")

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"judge {self.reward_name} #{self.pk} ({self.state})"


class JudgeScore(models.Model):
    """One rollout's score from a judge run: a campaign's copy (`rollout`) or a pool's (run, step, index)."""

    judge_run = models.ForeignKey(JudgeRun, on_delete=models.CASCADE, related_name="scores")
    rollout = models.ForeignKey(ReviewRollout, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    step = models.IntegerField(null=True, blank=True)
    index = models.IntegerField(null=True, blank=True)
    score = models.FloatField(null=True, blank=True, help_text="Null when the reward failed on it.")
    errors = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["judge_run", "id"]
        constraints = [
            models.UniqueConstraint(fields=["judge_run", "rollout"], name="unique_judge_score_rollout"),
            models.UniqueConstraint(fields=["judge_run", "run", "step", "index"], name="unique_judge_score_ref"),
        ]
