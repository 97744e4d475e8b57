"""Experiments and runs. A run's state changes only in services, as compare-and-set updates, each
recorded with its reason (RunTransition). Events from the engine land in the tables below."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from posttrain.projects.models import default_project_id


class Experiment(models.Model):
    """A run config (validated by the engine's schema) built from registry assets; it holds any number of runs.

    An experiment without a model is a project of external runs (tracked from TRL, OpenRLHF, verl, ...
    through the SDK): it groups them, and nothing launches from it."""

    project = models.ForeignKey(
        "projects.Project", on_delete=models.PROTECT, default=default_project_id, related_name="+"
    )
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    model = models.ForeignKey(
        "registry.ModelAsset", null=True, blank=True, on_delete=models.PROTECT, related_name="experiments"
    )
    dataset = models.ForeignKey(
        "registry.Dataset", null=True, blank=True, on_delete=models.PROTECT, related_name="experiments"
    )
    rewards = models.ManyToManyField("registry.RewardFunction", through="ExperimentReward", related_name="experiments")
    config = models.JSONField(
        help_text="Engine run config without model/data/rewards (filled from the registry at launch)."
    )
    webhook_url = models.CharField(
        max_length=2000,
        blank=True,
        default="",
        help_text="Where its runs' critical alerts are POSTed (JSON, Slack-compatible); checked by the outbound policy.",
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_external(self) -> bool:
        return self.model_id is None


class ExperimentReward(models.Model):
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE)
    reward = models.ForeignKey("registry.RewardFunction", on_delete=models.PROTECT)
    weight = models.FloatField(default=1.0)
    position = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["position"]
        constraints = [models.UniqueConstraint(fields=["experiment", "reward"], name="unique_reward_per_experiment")]


class RunState(models.TextChoices):
    DRAFT = "draft"
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    CANCELLING = "cancelling"
    PREEMPTING = "preempting"  # asked to checkpoint at the next step boundary and exit (the scheduler)
    PREEMPTED = "preempted"  # back in the queue; resumes from that checkpoint when admitted again
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})


class RunKind(models.TextChoices):
    NATIVE = "native"  # our engine, one Ray job dispatched by the platform
    EXTERNAL = "external"  # another engine's run, tracked through the SDK: its client drives the state


class RunPriority(models.TextChoices):
    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"
    URGENT = "urgent"  # admins and staff only


PRIORITY_RANK = {RunPriority.LOW: 0, RunPriority.NORMAL: 1, RunPriority.HIGH: 2, RunPriority.URGENT: 3}


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)  # also its first Ray submission id
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="runs")
    project = models.ForeignKey(
        "projects.Project",
        on_delete=models.PROTECT,
        default=default_project_id,
        related_name="+",
        help_text="Its experiment's (kept on the run for the reads and the queue, which scope by it).",
    )
    kind = models.CharField(max_length=20, choices=RunKind.choices, default=RunKind.NATIVE, db_index=True)
    engine = models.CharField(
        max_length=50,
        default="posttrain",
        help_text="What trains: posttrain for native runs; trl, verl, ... as tracked.",
    )
    total_steps = models.IntegerField(
        null=True, blank=True, help_text="Steps the run will take, as its client announced (external runs)."
    )
    name = models.CharField(max_length=200, blank=True)
    seed = models.IntegerField(default=0)
    state = models.CharField(max_length=20, choices=RunState.choices, default=RunState.DRAFT, db_index=True)
    state_reason = models.TextField(blank=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)
    resolved_config = models.JSONField(null=True, blank=True, help_text="The exact config the engine received.")
    tags = models.JSONField(default=list, blank=True)
    note = models.TextField(blank=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    resume_from = models.ForeignKey("Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    ingest_token_hash = models.CharField(max_length=64, blank=True)
    last_seq = models.BigIntegerField(default=0, help_text="Highest event seq stored (events arrive contiguously).")
    last_event_at = models.DateTimeField(null=True, blank=True)
    last_step = models.IntegerField(null=True, blank=True)
    summary = models.JSONField(
        default=dict,
        blank=True,
        help_text='Per metric {"last", "step", "min", "max", "count"} over every step stored (W&B\'s run summary): '
        "the runs list and compare tables read it instead of the series.",
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    # The scheduler (posttrain.scheduling.services; docs/ARCHITECTURE.md, "The scheduler").
    resources = models.JSONField(
        null=True,
        blank=True,
        help_text='What a native run holds on the cluster, from the engine\'s placement plan: {"driver": {"CPU", "GPU"}, '
        '"bundles": [{"CPU", "GPU"}], "total": {"CPU", "GPU"}}.',
    )
    priority = models.CharField(max_length=10, choices=RunPriority.choices, default=RunPriority.NORMAL)
    preemptible = models.BooleanField(default=True, help_text="False: the scheduler never preempts the run.")
    queue_position = models.IntegerField(null=True, blank=True, help_text="1 = next to start; null when not waiting.")
    queue_reason = models.TextField(blank=True, help_text="Why a waiting run waits, as the last admission saw it.")
    attempt = models.PositiveIntegerField(
        default=0, help_text="Ray jobs the run took before this one: each resume after a preemption is a new job."
    )
    placement = models.JSONField(
        null=True,
        blank=True,
        help_text='Where admission placed a holding run\'s pieces: {node id: {"CPU", "GPU"}}.',
    )
    queue_estimated_start = models.DateTimeField(
        null=True, blank=True, help_text="When a waiting run is expected to start, as the last admission planned it."
    )
    lost_steps = models.PositiveIntegerField(
        default=0, help_text="Steps done and lost again: a preempted run stopped at the deadline resumes before them."
    )

    class Meta:
        ordering = ["-created_at"]
        permissions = [("launch_unpreemptible", "Can launch runs the scheduler never preempts")]

    def __str__(self) -> str:
        return self.name or str(self.id)

    @property
    def ray_job_id(self) -> str:
        """The Ray submission id of the run's current job: the run id, then `<run id>-<attempt>` for each
        resume after a preemption (a submission id is unique for the cluster's life)."""
        return str(self.id) if not self.attempt else f"{self.id}-{self.attempt}"

    @property
    def is_external(self) -> bool:
        return self.kind == RunKind.EXTERNAL

    @property
    def planned_steps(self) -> int | None:
        """train.steps of a native run's config, the announced total of an external one."""
        if self.total_steps is not None:
            return self.total_steps
        config = self.resolved_config if isinstance(self.resolved_config, dict) else {}
        steps = (config.get("train") or {}).get("steps") if isinstance(config.get("train"), dict) else None
        return steps if isinstance(steps, int) else None


class RunTransition(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=20, choices=RunState.choices)
    to_state = models.CharField(max_length=20, choices=RunState.choices)
    reason = models.TextField(blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]


class Checkpoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    seq = models.BigIntegerField(default=0, help_text="Seq of the checkpoint event (live-stream replay).")
    step = models.IntegerField()
    path = models.CharField(max_length=1000)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="unique_checkpoint_step")]


class AlertDelivery(models.Model):
    """A run's critical alert sent to its experiment's webhook, once per (run, code, metric): the alert's first
    step is where it stays (diagnostics rules are causal). pending -> sent | failed; `attempts` counts POSTs."""

    class State(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        FAILED = "failed"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="alert_deliveries")
    code = models.CharField(max_length=100)
    metric = models.CharField(max_length=200)
    step = models.IntegerField()
    url = models.CharField(max_length=2000, help_text="The webhook it went to (the experiment's at the time).")
    payload = models.JSONField(help_text="The JSON body POSTed.")
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    attempts = models.IntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [models.UniqueConstraint(fields=["run", "code", "metric"], name="one_delivery_per_alert")]

    def __str__(self) -> str:
        return f"{self.code} of run {self.run_id} at step {self.step} ({self.state})"
