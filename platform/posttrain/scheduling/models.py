"""What the scheduler keeps: each user's, group's and project's quota, the cluster as the last admission saw it, the
cluster's use over time, and every preemption."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from posttrain.runs.models import Run


class QuotaKind(models.TextChoices):
    """Whom a quota belongs to."""

    USER = "user"
    GROUP = "group"
    PROJECT = "project"


class Quota(models.Model):
    """Limits of the runs that hold cluster resources at once, for one user, one group or one project; empty = no
    limit. A run is held to its user's own quota, to each quota of its user's groups (each counts that user's runs)
    and to its project's quota (which counts every run of the project, whoever launched it): the tightest wins.
    A project's or group's quota also makes it a team for fair share (docs/SCHEDULER.md, "Quotas")."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="run_quota"
    )
    group = models.OneToOneField(
        "auth.Group", null=True, blank=True, on_delete=models.CASCADE, related_name="run_quota"
    )
    project = models.OneToOneField(
        "projects.Project", null=True, blank=True, on_delete=models.CASCADE, related_name="run_quota"
    )
    max_runs = models.PositiveIntegerField(null=True, blank=True, help_text="Concurrent runs.")
    max_cpus = models.FloatField(null=True, blank=True, help_text="CPUs held at once.")
    max_gpus = models.FloatField(null=True, blank=True, help_text="GPUs held at once.")
    weight = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.001)],
        help_text="Fair share: the user's, team's or project's share of the cluster over time, relative to the "
        "others'.",
    )
    borrowing = models.BooleanField(
        default=False,
        help_text="A group's or a project's quota only: its CPU and GPU limits are a guarantee rather than a cap. "
        "Its runs may borrow idle room beyond them, and another team or project within its own quota takes that "
        "room back by preemption.",
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(user__isnull=False, group__isnull=True, project__isnull=True)
                | models.Q(user__isnull=True, group__isnull=False, project__isnull=True)
                | models.Q(user__isnull=True, group__isnull=True, project__isnull=False),
                name="quota_for_one_user_group_or_project",
                violation_error_message="A quota belongs to exactly one user, group or project.",
            )
        ]

    def __str__(self) -> str:
        return f"quota of {self.kind} {self.user or self.group or self.project}"

    @property
    def kind(self) -> QuotaKind:
        if self.project_id is not None:
            return QuotaKind.PROJECT
        return QuotaKind.GROUP if self.group_id is not None else QuotaKind.USER

    def clean(self) -> None:
        if self.borrowing and self.user_id is not None:
            raise ValidationError({"borrowing": "only a group's or a project's quota lends and borrows"})


class ClusterSnapshot(models.Model):
    """The Ray cluster as the last admission saw it (one row): the queue page reads it, since the web
    process never asks Ray."""

    nodes = models.JSONField(default=list, help_text='[{"node_id", "address", "total": {...}, "free": {...}}]')
    total = models.JSONField(default=dict)
    free = models.JSONField(default=dict)
    taken_at = models.DateTimeField(null=True, blank=True)


class ClusterSample(models.Model):
    """The cluster's capacity, what the platform granted and what Ray reported in use, at one moment: the
    reconcile records one per pass (utilisation over time, /queue/ and /api/queue/metrics)."""

    at = models.DateTimeField(db_index=True)
    total = models.JSONField(default=dict)
    granted = models.JSONField(default=dict)
    used = models.JSONField(default=dict)

    class Meta:
        ordering = ["at"]


class Preemption(models.Model):
    """One preemption of a run: asked, then settled when the run left (at a step boundary, or stopped at
    the deadline), with the steps it lost."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="preemptions")
    reason = models.TextField(blank=True)
    requested_at = models.DateTimeField(auto_now_add=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    forced = models.BooleanField(default=False, help_text="Stopped at the deadline rather than at a step boundary.")
    step = models.IntegerField(null=True, blank=True, help_text="The last step it had reported when it left.")
    resumed_step = models.IntegerField(null=True, blank=True, help_text="The checkpoint step it resumes after.")
    lost_steps = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["requested_at", "id"]
