"""Serializers of the runs API: shapes only. Rules live in posttrain.runs.services."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rest_framework import serializers

from posttrain.projects.api.fields import ReadableRelatedField, project_input_field, project_name_field
from posttrain.registry.models import Dataset, ModelAsset, RewardFunction
from posttrain.runs.models import Checkpoint, Experiment, ExperimentReward, Run, RunPriority, RunTransition
from posttrain.runs.selectors import experiment_probe_summaries

# --- experiments -----------------------------------------------------------------------------


class ExperimentRewardSerializer(serializers.ModelSerializer):
    reward_name = serializers.CharField(source="reward.name", read_only=True)

    class Meta:
        model = ExperimentReward
        fields = ["reward", "reward_name", "weight"]


class ExperimentSerializer(serializers.ModelSerializer):
    project_name = project_name_field()
    rewards = ExperimentRewardSerializer(source="experimentreward_set", many=True, read_only=True)
    run_count = serializers.IntegerField(read_only=True, default=0)
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None, allow_null=True)
    probes = serializers.SerializerMethodField(
        help_text="Per reward, its newest probe on the experiment's dataset (null probe: never probed there): "
        "state, hackable, the worst probe and its fraction of the honest reward."
    )

    class Meta:
        model = Experiment
        fields = [
            "id",
            "project",
            "project_name",
            "name",
            "description",
            "model",
            "dataset",
            "rewards",
            "probes",
            "webhook_url",
            "config",
            "run_count",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields

    def get_probes(self, experiment: Experiment) -> list[dict[str, Any]]:
        return experiment_probe_summaries(experiment)


class RewardWeightSerializer(serializers.Serializer):
    reward = ReadableRelatedField(
        queryset=RewardFunction.objects.all(), help_text="A reward of the experiment's project."
    )
    weight = serializers.FloatField(default=1.0)


class ExperimentCreateSerializer(serializers.Serializer):
    project = project_input_field()
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    model = ReadableRelatedField(queryset=ModelAsset.objects.all(), help_text="A model of the experiment's project.")
    dataset = ReadableRelatedField(queryset=Dataset.objects.all(), help_text="A dataset of the experiment's project.")
    rewards = RewardWeightSerializer(
        many=True, allow_empty=True, help_text="Empty only with a multi-turn environment or an agent in config."
    )
    config = serializers.JSONField(
        help_text="Engine run config (rl_engine.config) without model.path, the dataset's data fields, "
        "rewards and logging.run_dir: those come from the registry and the platform.",
    )
    webhook_url = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=2000,
        help_text="Where the runs' critical alerts are POSTed (JSON with a Slack-compatible `text`); the outbound "
        "policy must allow it (POSTTRAIN_HTTP_ALLOW for a private address).",
    )


class ExperimentUpdateSerializer(serializers.Serializer):
    webhook_url = serializers.CharField(
        allow_blank=True, max_length=2000, help_text="Where the runs' critical alerts are POSTed; empty: nowhere."
    )


# --- runs ------------------------------------------------------------------------------------


class RunSerializer(serializers.ModelSerializer):
    project_name = project_name_field()
    experiment_name = serializers.CharField(source="experiment.name", read_only=True)
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None, allow_null=True)
    algorithm = serializers.SerializerMethodField(help_text="The engine config's algorithm.name (grpo, ppo, ...).")
    ray_job_id = serializers.SerializerMethodField(
        help_text="The Ray submission id of the run's current job (a native run's id, then <id>-<n> after its "
        "n-th resume from a preemption); null for an external run."
    )
    model_name = serializers.CharField(
        source="experiment.model.name",
        read_only=True,
        default=None,
        allow_null=True,
        help_text="Null for external runs.",
    )
    dataset_name = serializers.CharField(
        source="experiment.dataset.name",
        read_only=True,
        default=None,
        allow_null=True,
        help_text="Null for external runs.",
    )
    total_steps = serializers.IntegerField(
        source="planned_steps",
        read_only=True,
        allow_null=True,
        help_text="train.steps (native) or the client's announced total (null: an external run that gave none).",
    )
    summary = serializers.JSONField(
        read_only=True, help_text='Per metric {"last", "step", "min", "max", "count"} over the whole run.'
    )
    resources = serializers.JSONField(
        read_only=True,
        allow_null=True,
        help_text='What the run holds on the cluster: {"driver", "bundles", "total"} in CPUs and GPUs (null: external).',
    )
    queue_position = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="1 = the next run to start; null when the run is not waiting."
    )

    class Meta:
        model = Run
        fields = [
            "id",
            "project",
            "project_name",
            "experiment",
            "experiment_name",
            "kind",
            "engine",
            "name",
            "seed",
            "state",
            "state_reason",
            "state_changed_at",
            "tags",
            "note",
            "parent",
            "resume_from",
            "last_seq",
            "last_step",
            "total_steps",
            "last_event_at",
            "started_at",
            "finished_at",
            "created_by",
            "created_at",
            "algorithm",
            "model_name",
            "dataset_name",
            "summary",
            "resources",
            "priority",
            "preemptible",
            "queue_position",
            "queue_reason",
            "queue_estimated_start",
            "attempt",
            "ray_job_id",
            "lost_steps",
        ]
        read_only_fields = fields

    def get_ray_job_id(self, run: Run) -> str | None:
        return None if run.is_external else run.ray_job_id

    def get_algorithm(self, run: Run) -> str | None:
        config = run.resolved_config if isinstance(run.resolved_config, dict) else {}
        algorithm = config.get("algorithm")
        return algorithm.get("name") if isinstance(algorithm, dict) else None


class RunDetailSerializer(RunSerializer):
    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "resolved_config"]
        read_only_fields = fields


class ExternalRunCreateSerializer(serializers.Serializer):
    project = project_input_field()
    experiment = serializers.CharField(
        max_length=200,
        help_text="Groups the runs (an experiment without a model, in the project); created on first use.",
    )
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    config = serializers.JSONField(
        required=False, default=dict, help_text="The run's hyperparameters, any JSON object."
    )
    engine = serializers.CharField(
        max_length=50, required=False, default="python", help_text="trl, openrlhf, verl, ..."
    )
    tags = serializers.ListField(child=serializers.CharField(max_length=50), required=False, default=list)
    note = serializers.CharField(required=False, allow_blank=True, default="")
    total_steps = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1)


class ExternalRunCreatedSerializer(serializers.Serializer):
    run = RunDetailSerializer()
    events_url = serializers.CharField(help_text="POST the run's events here (the engine's protocol).")
    ingest_token = serializers.CharField(help_text="Authorization: Bearer <ingest_token> on the events endpoint.")


class RunLaunchSerializer(serializers.Serializer):
    seed = serializers.IntegerField(
        required=False, allow_null=True, default=None, help_text="Default: the experiment config's seed (else 0)."
    )
    tags = serializers.ListField(child=serializers.CharField(max_length=50), required=False, default=list)
    note = serializers.CharField(required=False, allow_blank=True, default="")
    priority = serializers.ChoiceField(
        choices=RunPriority.choices, required=False, default=None, help_text="Default normal; urgent: admins only."
    )
    preemptible = serializers.BooleanField(
        required=False,
        default=None,
        allow_null=True,
        help_text="Default true; false (never preempted) needs the runs.launch_unpreemptible permission.",
    )


class RunCloneSerializer(serializers.Serializer):
    project = project_input_field(
        "Clone into another project (its id or name): the experiment and its model, dataset and rewards are copied "
        "there. Default: the source run's experiment."
    )
    seed = serializers.IntegerField(
        required=False, allow_null=True, default=None, help_text="Default: the source run's seed."
    )
    tags = serializers.ListField(
        child=serializers.CharField(max_length=50),
        required=False,
        allow_null=True,
        default=None,
        help_text="Default: the source run's tags.",
    )
    note = serializers.CharField(required=False, allow_blank=True, default="")
    priority = serializers.ChoiceField(
        choices=RunPriority.choices, required=False, default=None, help_text="Default normal; urgent: admins only."
    )


class RunResumeSerializer(serializers.Serializer):
    checkpoint = serializers.PrimaryKeyRelatedField(
        queryset=Checkpoint.objects.all(), help_text="A checkpoint of this run."
    )


class CheckpointRegisterSerializer(serializers.Serializer):
    project = project_input_field("The project the model is registered in (its id or name). Default: the run's.")
    checkpoint = serializers.PrimaryKeyRelatedField(
        queryset=Checkpoint.objects.all(), help_text="A checkpoint of this run."
    )
    name = serializers.CharField(max_length=200, required=False, help_text="Model name; default <run>-step-<n>.")

    def validate_checkpoint(self, checkpoint: Checkpoint) -> Checkpoint:
        if checkpoint.run_id != self.context["run"].pk:
            raise serializers.ValidationError("not a checkpoint of this run")
        return checkpoint


class RunUpdateSerializer(serializers.Serializer):
    tags = serializers.ListField(child=serializers.CharField(max_length=50), required=False)
    note = serializers.CharField(required=False, allow_blank=True)


class CheckpointSerializer(serializers.ModelSerializer):
    available = serializers.SerializerMethodField(
        help_text="False once the engine pruned the folder (checkpoint.keep_last): it can no longer be "
        "registered or resumed from."
    )

    class Meta:
        model = Checkpoint
        fields = ["id", "step", "path", "available", "created_at"]

    def get_available(self, checkpoint: Checkpoint) -> bool:
        return Path(checkpoint.path).is_dir()


class RunTransitionSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunTransition
        fields = ["from_state", "to_state", "reason", "at"]
