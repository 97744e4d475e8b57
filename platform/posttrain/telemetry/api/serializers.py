"""Serializers of the telemetry API: shapes only (what the event endpoint documents, what a run reported)."""

from __future__ import annotations

from rest_framework import serializers

from posttrain.telemetry.api.rollouts import GapSerializer


class EventSerializer(serializers.Serializer):
    run = serializers.CharField()
    seq = serializers.IntegerField(min_value=1)
    type = serializers.ChoiceField(choices=["metrics", "samples", "checkpoint", "log", "status", "heartbeat"])
    step = serializers.IntegerField(allow_null=True, min_value=0)
    time = serializers.FloatField()
    data = serializers.DictField()


class EventBatchSerializer(serializers.Serializer):
    events = EventSerializer(many=True)


class EventAckSerializer(serializers.Serializer):
    acknowledged_seq = serializers.IntegerField(help_text="Every event up to this seq is stored.")
    stored = serializers.IntegerField(help_text="Events of this batch stored now (repeats are dropped).")


# --- the scheduler's queue ------------------------------------------------------------------


class SampleSerializer(serializers.Serializer):
    """One rollout as the API gives it (a row of the step's rollout file; posttrain.telemetry.rollouts)."""

    run = serializers.CharField(help_text="The run's id.")
    step = serializers.IntegerField()
    index = serializers.IntegerField()
    group = serializers.IntegerField()
    prompt = serializers.CharField()
    response = serializers.CharField()
    label = serializers.CharField(allow_null=True)
    reward = serializers.FloatField(allow_null=True)
    components = serializers.DictField(child=serializers.FloatField(allow_null=True))
    advantage = serializers.FloatField(allow_null=True)
    length = serializers.IntegerField()
    finish_reason = serializers.CharField()
    errors = serializers.ListField(child=serializers.CharField())
    kept = serializers.BooleanField()
    turns = serializers.ListField(child=serializers.DictField(), allow_null=True)
    env = serializers.DictField(child=serializers.FloatField(allow_null=True))
    truncated = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="What the answer cut, with its full length: characters of a text, items of a list "
        '("<column>.text": the longest item\'s characters). Empty when nothing was cut.',
    )


class SamplePageSerializer(serializers.Serializer):
    count = serializers.IntegerField(allow_null=True, help_text="Null when only reading every file could tell.")
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = SampleSerializer(many=True)
    gaps = GapSerializer(many=True, help_text="Steps whose rollout file is missing or cannot be read.")


class SampleRefSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    index = serializers.IntegerField()


class SampleTokensSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    index = serializers.IntegerField()
    tokens = serializers.JSONField(
        help_text="{text: [piece], rollout_logprob, trainer_logprob, entropy, advantage: base64 little-endian "
        "float16 (one per token; a field the step did not produce is absent), versions: [[version, tokens]], "
        "truncated: {column: its full length} when the lists were cut}"
    )
    same_prompt = SampleRefSerializer(many=True, help_text="The responses to the same prompt, by step.")
    gaps = GapSerializer(many=True, help_text="Files the same-prompt search could not read.")


class MetricSeriesSerializer(serializers.Serializer):
    steps = serializers.ListField(child=serializers.IntegerField())
    values = serializers.ListField(child=serializers.FloatField(allow_null=True))


class MetricsSerializer(serializers.Serializer):
    series = serializers.DictField(child=MetricSeriesSerializer(), help_text="Metric name to its points.")


class RunLogsSerializer(serializers.Serializer):
    logs = serializers.CharField(help_text="The Ray job's stdout and stderr (the tail, when truncated).")
    truncated = serializers.BooleanField()
    job = serializers.CharField(allow_null=True, help_text="Ray submission id; null when Ray has no job yet.")
