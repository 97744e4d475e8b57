"""Serializers of the registry API: output shapes, and input checks of types and lengths only
(the rules live in the services)."""

from __future__ import annotations

from rest_framework import serializers

from posttrain.projects.api.fields import ReadableRelatedField, project_input_field, project_name_field
from posttrain.registry.models import (
    Dataset,
    Environment,
    EnvironmentTrial,
    ModelAsset,
    ModelImport,
    RewardFunction,
    RewardProbe,
    RewardTrial,
)
from posttrain.registry.reward_specs import KINDS
from posttrain.registry.services import MAX_TRY_SAMPLES


class ModelAssetSerializer(serializers.ModelSerializer):
    project_name = project_name_field()
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = ModelAsset
        fields = [
            "id",
            "project",
            "project_name",
            "name",
            "description",
            "source",
            "path",
            "architecture",
            "parameter_count",
            "hf_config",
            "source_run",
            "source_step",
            "provenance",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class ModelImportSerializer(serializers.ModelSerializer):
    project_name = project_name_field()
    model = ModelAssetSerializer(read_only=True, allow_null=True, help_text="The model, once done.")
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True, default=None)
    url = serializers.SerializerMethodField()

    class Meta:
        model = ModelImport
        fields = [
            "id",
            "url",
            "project",
            "project_name",
            "name",
            "description",
            "source_name",
            "size_bytes",
            "sha256",
            "state",
            "error",
            "model",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_url(self, record: ModelImport) -> str:
        return f"/api/models/imports/{record.id}/"


class _ModelImportInputSerializer(serializers.Serializer):
    project = project_input_field()
    name = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default="", help_text="Defaults to the file name."
    )
    description = serializers.CharField(required=False, allow_blank=True, default="")


class ModelImportUploadSerializer(_ModelImportInputSerializer):
    file = serializers.FileField(
        help_text="A GGUF file (llama.cpp's format) of an architecture transformers dequantizes: Llama, Qwen2, "
        "Mistral, Gemma, Phi-3, ..."
    )


class ModelImportPathSerializer(_ModelImportInputSerializer):
    path = serializers.CharField(
        max_length=1000, help_text="A GGUF file on the server (inside an import root); the worker copies it."
    )


class ModelRegisterSerializer(serializers.Serializer):
    project = project_input_field()
    name = serializers.CharField(max_length=200)
    path = serializers.CharField(
        max_length=1000, help_text="Hugging Face model folder on the server (config.json, weights, tokenizer)."
    )
    description = serializers.CharField(required=False, allow_blank=True, default="")


class AssetUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    description = serializers.CharField(required=False, allow_blank=True)


class DatasetSerializer(serializers.ModelSerializer):
    project_name = project_name_field()
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Dataset
        fields = [
            "id",
            "project",
            "project_name",
            "name",
            "description",
            "sha256",
            "format",
            "path",
            "size_bytes",
            "row_count",
            "prompt_field",
            "label_field",
            "columns",
            "splits",
            "source_campaign_id",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class _DatasetInputSerializer(serializers.Serializer):
    project = project_input_field()
    name = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default="", help_text="Defaults to the file name."
    )
    description = serializers.CharField(required=False, allow_blank=True, default="")
    format = serializers.ChoiceField(
        choices=Dataset.Format.choices,
        required=False,
        allow_null=True,
        default=None,
        help_text="Defaults to the file extension.",
    )
    prompt_field = serializers.CharField(
        max_length=200, required=False, default="prompt", help_text="Field (column) holding the prompt."
    )
    label_field = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        default="label",
        help_text="Field (column) holding the reference answer; empty for a dataset without labels.",
    )


class DatasetUploadSerializer(_DatasetInputSerializer):
    file = serializers.FileField(help_text="JSONL, CSV (with a header line) or Parquet; UTF-8 text.")


class DatasetRegisterPathSerializer(_DatasetInputSerializer):
    path = serializers.CharField(
        max_length=1000, help_text="Absolute path of a data file on the server; it is copied into the store."
    )


class DatasetPreviewSerializer(serializers.Serializer):
    columns = serializers.ListField(child=serializers.CharField())
    rows = serializers.ListField(child=serializers.DictField())
    row_count = serializers.IntegerField()
    prompt_field = serializers.CharField()
    label_field = serializers.CharField()


class RewardFunctionSerializer(serializers.ModelSerializer):
    project_name = project_name_field()
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = RewardFunction
        fields = [
            "id",
            "project",
            "project_name",
            "name",
            "description",
            "kind",
            "spec",
            "source",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class RewardCreateSerializer(serializers.Serializer):
    project = project_input_field()
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    kind = serializers.ChoiceField(choices=KINDS)
    spec = serializers.JSONField(
        required=False,
        default=dict,
        help_text="The engine's reward spec (rl_engine.config RewardSpec) without weight: e.g. "
        '{"type": "regex", "pattern": "\\\\d+"}; for kind python, the function name and limits.',
    )
    source = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        trim_whitespace=False,
        help_text="Python code for kind python: reward_func(queries, prompts, labels, **kwargs) or compute_score(...).",
    )


class RewardTrySampleSerializer(serializers.Serializer):
    prompt = serializers.CharField(allow_blank=True, trim_whitespace=False)
    response = serializers.CharField(allow_blank=True, trim_whitespace=False)
    label = serializers.JSONField(
        required=False, allow_null=True, default=None, help_text="Reference answer (text or number)."
    )
    metadata = serializers.DictField(required=False, default=dict, help_text="Extra dataset fields (data_source, ...).")


class RewardTrySerializer(serializers.Serializer):
    # many=True hands min_length/max_length to the ListSerializer; the stubs type only the child's arguments.
    samples = RewardTrySampleSerializer(many=True, min_length=1, max_length=MAX_TRY_SAMPLES)  # type: ignore[call-arg]


class RewardScoresSerializer(serializers.Serializer):
    scores = serializers.ListField(child=serializers.FloatField(), help_text="Weighted total per sample.")
    components = serializers.DictField(child=serializers.ListField(child=serializers.FloatField()))
    errors = serializers.ListField(child=serializers.ListField(child=serializers.CharField()))
    extra_logs = serializers.DictField(child=serializers.FloatField())


class RewardTryResultSerializer(RewardScoresSerializer):
    trial = serializers.UUIDField(help_text="The trial that ran on a worker (GET it under trials/).")


class RewardTrialSerializer(serializers.ModelSerializer):
    result = RewardScoresSerializer(allow_null=True, read_only=True, help_text="The scores, once done.")
    url = serializers.SerializerMethodField()

    class Meta:
        model = RewardTrial
        fields = ["id", "kind", "state", "result", "error", "created_at", "finished_at", "url"]
        read_only_fields = fields

    def get_url(self, trial: RewardTrial) -> str:
        return f"/api/rewards/{trial.reward_id}/trials/{trial.id}/"


# --- environments ----------------------------------------------------------------------------------


class EnvironmentSerializer(serializers.ModelSerializer):
    project_name = project_name_field()
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True, default=None)
    dataset_name = serializers.CharField(source="dataset.name", read_only=True, allow_null=True, default=None)
    reward_name = serializers.CharField(source="reward.name", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Environment
        fields = [
            "id",
            "project",
            "project_name",
            "name",
            "description",
            "package",
            "env_id",
            "arguments",
            "files",
            "version",
            "size",
            "seed",
            "state",
            "error",
            "dataset",
            "dataset_name",
            "reward",
            "reward_name",
            "run_environment",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class EnvironmentCreateSerializer(serializers.Serializer):
    project = project_input_field()
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    package = serializers.ChoiceField(choices=Environment.Package.choices)
    env_id = serializers.CharField(
        max_length=300,
        help_text="reasoning-gym: a task (basic_arithmetic); verifiers: a taskset id; TextArena: a game "
        "(GuessTheNumber-v0); OpenEnv: the server's ASGI app (module:attribute).",
    )
    arguments = serializers.JSONField(
        required=False,
        default=dict,
        help_text="The package's settings: a reasoning-gym task's config, a taskset's arguments, TextArena's "
        "num_players and seat, OpenEnv's action_field and observation_field.",
    )
    size = serializers.IntegerField(required=False, default=500, help_text="Rows to generate.")
    seed = serializers.IntegerField(required=False, default=0)
    files = serializers.ListField(
        child=serializers.CharField(max_length=1000),
        required=False,
        default=list,
        help_text="Server files of modules it needs that are not installed (a verifiers taskset, an OpenEnv app).",
    )


class EnvironmentTrySerializer(serializers.Serializer):
    moves = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False, max_length=20000),
        min_length=1,
        max_length=32,
        help_text="The model's turns, in order (a single-turn environment scores the first).",
    )
    row = serializers.IntegerField(required=False, default=0, help_text="The dataset row the episode starts from.")


class EnvironmentTrialSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()

    class Meta:
        model = EnvironmentTrial
        fields = ["id", "state", "row", "moves", "result", "error", "created_at", "finished_at", "url"]
        read_only_fields = fields

    def get_url(self, trial: EnvironmentTrial) -> str:
        return f"/api/environments/{trial.environment_id}/trials/{trial.id}/"


class EnvironmentMixPartSerializer(serializers.Serializer):
    environment = serializers.CharField(max_length=200, help_text="An environment's name or id.")
    weight = serializers.FloatField(default=1.0)


class EnvironmentMixSerializer(serializers.Serializer):
    project = project_input_field()
    name = serializers.CharField(max_length=200, help_text="The mixed dataset's name.")
    environments = EnvironmentMixPartSerializer(many=True, min_length=2)  # type: ignore[call-arg]
    size = serializers.IntegerField(default=500)
    seed = serializers.IntegerField(default=0)


class EnvironmentMixResultSerializer(serializers.Serializer):
    dataset = DatasetSerializer()
    rewards = serializers.ListField(child=serializers.CharField(), help_text="The parts' rewards, for the experiment.")


class RewardProbeStartSerializer(serializers.Serializer):
    dataset = ReadableRelatedField(
        queryset=Dataset.objects.all(),
        help_text="The dataset whose rows the adversarial answers are built from (in the reward's project).",
    )


class AssetCopySerializer(serializers.Serializer):
    project = project_input_field()
    name = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default="", help_text="Default: the source's name."
    )


class RewardProbeSerializer(serializers.ModelSerializer):
    dataset_name = serializers.CharField(source="dataset.name", read_only=True)
    result = serializers.JSONField(
        allow_null=True,
        read_only=True,
        help_text="The hackability report once done: honest_mean, rows, hackable, worst, note and probes "
        "[{probe, mean, fraction (of honest_mean), flagged (fraction >= 0.5), errors}].",
    )
    examples = serializers.JSONField(
        read_only=True, help_text="Each probe's answer for the first row probed, with its score."
    )
    url = serializers.SerializerMethodField()

    class Meta:
        model = RewardProbe
        fields = [
            "id",
            "reward",
            "dataset",
            "dataset_name",
            "state",
            "result",
            "examples",
            "error",
            "created_at",
            "started_at",
            "finished_at",
            "url",
        ]
        read_only_fields = fields

    def get_url(self, probe: RewardProbe) -> str:
        return f"/api/rewards/{probe.reward_id}/probes/{probe.id}/"
