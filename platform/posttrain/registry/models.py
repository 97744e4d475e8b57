"""The registry: policy models, prompt datasets and reward functions that experiments are built from."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from posttrain.core.worker_jobs import WorkerJob
from posttrain.projects.models import default_project_id


class ModelAsset(models.Model):
    """A policy model: a local Hugging Face folder, a checkpoint of an earlier run (lineage kept), or a GGUF file
    converted into a folder of the models store (`provenance` says from what)."""

    class Source(models.TextChoices):
        FOLDER = "folder", "Local folder"
        CHECKPOINT = "checkpoint", "Run checkpoint"
        GGUF = "gguf", "GGUF import"

    project = models.ForeignKey(
        "projects.Project", on_delete=models.PROTECT, default=default_project_id, related_name="+"
    )
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    source = models.CharField(max_length=20, choices=Source.choices, default=Source.FOLDER)
    path = models.CharField(max_length=1000, help_text="Hugging Face model folder (weights, config, tokenizer).")
    architecture = models.CharField(max_length=200, blank=True)
    parameter_count = models.BigIntegerField(null=True, blank=True)
    hf_config = models.JSONField(default=dict, blank=True)
    source_run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    source_step = models.IntegerField(null=True, blank=True)
    provenance = models.JSONField(
        default=dict,
        blank=True,
        help_text="Where an imported model came from: the GGUF's name, sha256, architecture, quantization, the "
        "dtype it was converted to, the check's answers.",
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        # Naming a file or folder on the server (posttrain.core.server_paths.IMPORT_PERMISSION): an admin grants
        # it per user or group (Django admin, or `manage.py grant_server_paths`); uploads need none.
        permissions = [("import_server_paths", "Can name server paths (datasets, models, reward and run files)")]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="unique_model_name_per_project")]

    def __str__(self) -> str:
        return self.name


class ModelImport(models.Model):
    """A GGUF file becoming a model: converted on the user-code worker in the engine's sandbox (queued -> running ->
    done, with the model, | failed, with why), never in the web process. An upload waits in the models store's
    staging folder named by the import's id; a server file is copied there by the worker."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey("projects.Project", on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=200, help_text="The model's name once imported.")
    description = models.TextField(blank=True)
    source_name = models.CharField(max_length=300, help_text="The file's name, as uploaded or on the server.")
    source_path = models.CharField(max_length=1000, blank=True, help_text="The server file (empty: an upload).")
    size_bytes = models.BigIntegerField(null=True, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    error = models.TextField(blank=True)
    model = models.ForeignKey(ModelAsset, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"import {self.id} of {self.source_name} ({self.state})"


class Dataset(models.Model):
    """A prompt dataset stored once by content hash under `<storage>/datasets/<sha256>/`."""

    class Format(models.TextChoices):
        JSONL = "jsonl", "JSONL"
        PARQUET = "parquet", "Parquet"
        CSV = "csv", "CSV"

    project = models.ForeignKey(
        "projects.Project", on_delete=models.PROTECT, default=default_project_id, related_name="+"
    )
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    sha256 = models.CharField(max_length=64, db_index=True)
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
        # Stored once by content: the same file in another project is another row over the same stored file.
        constraints = [models.UniqueConstraint(fields=["project", "sha256"], name="unique_dataset_per_project")]

    def __str__(self) -> str:
        return f"{self.name} ({self.sha256[:12]})"


class RewardFunction(models.Model):
    """A reward component: `spec` is exactly one engine `RewardSpec` (rl_engine.config), minus `weight`."""

    class Kind(models.TextChoices):
        BUILTIN = "builtin", "Built-in verifier"
        PYTHON = "python", "Python source"
        HTTP = "http", "HTTP endpoint"
        REWARD_MODEL = "reward_model", "Reward model"

    project = models.ForeignKey(
        "projects.Project", on_delete=models.PROTECT, default=default_project_id, related_name="+"
    )
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    spec = models.JSONField(help_text="Engine reward spec: type and parameters.")
    source = models.TextField(blank=True, help_text="Python source, for kind=python (stored as a file too).")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="unique_reward_name_per_project")]

    def __str__(self) -> str:
        return self.name


class RewardTrial(WorkerJob):
    """User reward code run on a Celery worker for a web request, never in the web process: a "Try it"
    on sample inputs, or the import check of a new python reward's source. The web process waits for
    the outcome here (queued -> running -> done | failed)."""

    task_name = "reward_trial_run"
    result_fields = ("result",)

    class Kind(models.TextChoices):
        TRY = "try", "Try it"
        IMPORT_CHECK = "import_check", "Import check of new source"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    reward = models.ForeignKey(RewardFunction, null=True, blank=True, on_delete=models.CASCADE, related_name="trials")
    spec = models.JSONField(help_text="The reward spec the worker builds (a check: with the staged file's path).")
    samples = models.JSONField(default=list, blank=True)
    result = models.JSONField(null=True, blank=True, help_text="Try: scores, components, errors; check: problems.")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.state})"

    @classmethod
    def queue_wait_s(cls) -> float:
        """Its task expires when the web stops waiting: a "Try it" after REWARD_TRY_WAIT_S, an import check
        after the file's own timeout (at most the time limit) plus REWARD_CHECK_QUEUE_S."""
        return max(settings.REWARD_TRY_WAIT_S, settings.USER_CODE_TIME_LIMIT_S + settings.REWARD_CHECK_QUEUE_S)


class Environment(WorkerJob):
    """An installed environment (reasoning-gym, verifiers, TextArena, OpenEnv) as the registry keeps it: what
    it is (package, its id there, arguments, the package's version) and what a run takes from it, made by a
    worker in the engine's sandbox: its generated `dataset`, and its `reward` (single-turn packages) or the
    engine's `environment` section (multi-turn packages)."""

    class Package(models.TextChoices):
        REASONING_GYM = "reasoning_gym", "reasoning-gym"
        VERIFIERS = "verifiers", "verifiers"
        TEXTARENA = "textarena", "TextArena"
        OPENENV = "openenv", "OpenEnv"

    class State(models.TextChoices):
        GENERATING = "generating"
        READY = "ready"
        FAILED = "failed"

    # Generated by the worker: `generating` while queued and running (`started_at` tells which), `ready` when done.
    task_name = "environment_generate"
    result_fields = ("dataset", "reward", "run_environment")
    queued_state = running_state = State.GENERATING
    done_state = State.READY
    soft_limit_setting = "USER_CODE_LONG_SOFT_TIME_LIMIT_S"
    hard_limit_setting = "USER_CODE_LONG_TIME_LIMIT_S"

    project = models.ForeignKey(
        "projects.Project", on_delete=models.PROTECT, default=default_project_id, related_name="+"
    )
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    package = models.CharField(max_length=20, choices=Package.choices)
    env_id = models.CharField(max_length=300, help_text="The task, taskset, game or server app in the package.")
    arguments = models.JSONField(default=dict, blank=True, help_text="The package's own settings for it.")
    files = models.JSONField(default=list, blank=True, help_text="Modules it needs that are not installed.")
    version = models.CharField(max_length=100, blank=True, help_text="The package's version when registered.")
    size = models.IntegerField(help_text="Rows generated (at most, for a finite taskset).")
    seed = models.BigIntegerField(default=0)
    state = models.CharField(max_length=12, choices=State.choices, default=State.GENERATING)
    dataset = models.ForeignKey(Dataset, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    reward = models.ForeignKey(RewardFunction, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    run_environment = models.JSONField(
        null=True, blank=True, help_text="The engine's `environment` section (multi-turn packages)."
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="unique_environment_name_per_project")]

    def __str__(self) -> str:
        return self.name


class EnvironmentTrial(WorkerJob):
    """An environment's "Try it": one episode played with the moves a person typed, on a Celery worker in the
    engine's sandbox (queued -> running -> done | failed), never in the web process."""

    task_name = "environment_trial_run"
    result_fields = ("result",)
    queue_wait_setting = "REWARD_TRY_WAIT_S"  # its task expires when the web stops waiting

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="trials")
    row = models.IntegerField(default=0)
    moves = models.JSONField(default=list)
    result = models.JSONField(null=True, blank=True, help_text="turns, reward, errors.")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"try {self.id} ({self.state})"


class RewardProbe(WorkerJob):
    """A reward probed on a dataset (rl_engine.reward_probes): adversarial answers built from the dataset's
    rows scored against the honest ones by a worker on the user-code queue, never in the web process
    (queued -> running -> done | failed). `result` is the hackability report."""

    task_name = "reward_probe_run"
    result_fields = ("result", "examples")
    queue_wait_setting = "REWARD_PROBE_QUEUE_S"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    reward = models.ForeignKey(RewardFunction, on_delete=models.CASCADE, related_name="probes")
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="probes")
    result = models.JSONField(null=True, blank=True, help_text="The hackability report (rl_engine.reward_probes).")
    examples = models.JSONField(
        default=list, blank=True, help_text="Each probe's answer for the first row probed, as it was scored."
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["reward", "dataset", "-created_at"])]

    def __str__(self) -> str:
        return f"probe {self.id} of {self.reward_id} on {self.dataset_id} ({self.state})"
