"""The registry: policy models, prompt datasets and reward functions that experiments are built from."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class ModelAsset(models.Model):
    """A policy model: a local Hugging Face folder, or a checkpoint of an earlier run (lineage kept)."""

    class Source(models.TextChoices):
        FOLDER = "folder", "Local folder"
        CHECKPOINT = "checkpoint", "Run checkpoint"

    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(blank=True)
    source = models.CharField(max_length=20, choices=Source.choices, default=Source.FOLDER)
    path = models.CharField(max_length=1000, help_text="Hugging Face model folder (weights, config, tokenizer).")
    architecture = models.CharField(max_length=200, blank=True)
    parameter_count = models.BigIntegerField(null=True, blank=True)
    hf_config = models.JSONField(default=dict, blank=True)
    source_run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    source_step = models.IntegerField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name


class Dataset(models.Model):
    """A prompt dataset stored once by content hash under `<storage>/datasets/<sha256>/`."""

    class Format(models.TextChoices):
        JSONL = "jsonl", "JSONL"
        PARQUET = "parquet", "Parquet"
        CSV = "csv", "CSV"

    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    sha256 = models.CharField(max_length=64, unique=True)
    format = models.CharField(max_length=10, choices=Format.choices)
    path = models.CharField(max_length=1000, help_text="Stored file the engine reads.")
    size_bytes = models.BigIntegerField()
    row_count = models.IntegerField()
    prompt_field = models.CharField(max_length=200, default="prompt")
    label_field = models.CharField(max_length=200, blank=True, default="label")
    columns = models.JSONField(default=list)
    splits = models.JSONField(default=dict, help_text="Split name to row count.")
    preview = models.JSONField(default=list, help_text="The first rows.")
    source_campaign_id = models.BigIntegerField(null=True, blank=True)  # review exports (lineage)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.sha256[:12]})"


class RewardFunction(models.Model):
    """A reward component: `spec` is exactly one engine `RewardSpec` (rl_engine.config), minus `weight`."""

    class Kind(models.TextChoices):
        BUILTIN = "builtin", "Built-in verifier"
        PYTHON = "python", "Python source"
        HTTP = "http", "HTTP endpoint"
        REWARD_MODEL = "reward_model", "Reward model"

    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(blank=True)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    spec = models.JSONField(help_text="Engine reward spec: type and parameters.")
    source = models.TextField(blank=True, help_text="Python source, for kind=python (stored as a file too).")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name


class RewardTrial(models.Model):
    """User reward code run on a Celery worker for a web request, never in the web process: a "Try it"
    on sample inputs, or the import check of a new python reward's source. The web process waits for
    the outcome here (queued -> running -> done | failed)."""

    class Kind(models.TextChoices):
        TRY = "try", "Try it"
        IMPORT_CHECK = "import_check", "Import check of new source"

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    reward = models.ForeignKey(RewardFunction, null=True, blank=True, on_delete=models.CASCADE, related_name="trials")
    spec = models.JSONField(help_text="The reward spec the worker builds (a check: with the staged file's path).")
    samples = models.JSONField(default=list, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    result = models.JSONField(null=True, blank=True, help_text="Try: scores, components, errors; check: problems.")
    error = models.TextField(blank=True, help_text="Why the worker could not run it (not the code's own errors).")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.state})"
