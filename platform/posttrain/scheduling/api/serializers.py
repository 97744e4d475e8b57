"""Serializers of the scheduling API (the queue): shapes only."""

from __future__ import annotations

from rest_framework import serializers

from posttrain.runs.models import RunPriority


class ResourcesSerializer(serializers.Serializer):
    CPU = serializers.FloatField()
    GPU = serializers.FloatField()


_HIDDEN_HELP = "True: a run of a project you do not read (its id, owner and project are null, its name a placeholder)."


class QueuedRunSerializer(serializers.Serializer):
    id = serializers.CharField(allow_null=True)
    name = serializers.CharField()
    project = serializers.CharField(allow_null=True)
    hidden = serializers.BooleanField(help_text=_HIDDEN_HELP)
    state = serializers.CharField()
    owner = serializers.CharField(allow_null=True)
    priority = serializers.CharField()
    resources = ResourcesSerializer()
    queue_position = serializers.IntegerField(allow_null=True)
    reason = serializers.CharField()
    waiting_since = serializers.DateTimeField()
    estimated_start = serializers.DateTimeField(allow_null=True)


class GrantedRunSerializer(serializers.Serializer):
    id = serializers.CharField(allow_null=True)
    project = serializers.CharField(allow_null=True)
    hidden = serializers.BooleanField(help_text=_HIDDEN_HELP)
    attempt = serializers.IntegerField()
    lost_steps = serializers.IntegerField()
    placement = serializers.DictField(child=ResourcesSerializer(), allow_null=True)
    name = serializers.CharField()
    state = serializers.CharField()
    owner = serializers.CharField(allow_null=True)
    priority = serializers.CharField()
    preemptible = serializers.BooleanField()
    grant = ResourcesSerializer()
    last_step = serializers.IntegerField(allow_null=True)
    total_steps = serializers.IntegerField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)


class ClusterNodeSerializer(serializers.Serializer):
    node_id = serializers.CharField()
    address = serializers.CharField()
    head = serializers.BooleanField()
    total = ResourcesSerializer()
    free = ResourcesSerializer()


class ClusterSerializer(serializers.Serializer):
    nodes = ClusterNodeSerializer(many=True)
    total = serializers.DictField(child=serializers.FloatField())
    free = serializers.DictField(child=serializers.FloatField())
    as_of = serializers.DateTimeField(allow_null=True)
    age_s = serializers.FloatField(allow_null=True, help_text="Seconds since the scheduler read the cluster.")


class QueueSerializer(serializers.Serializer):
    waiting = QueuedRunSerializer(many=True)
    running = GrantedRunSerializer(many=True)
    cluster = ClusterSerializer()


class RunPrioritySerializer(serializers.Serializer):
    priority = serializers.ChoiceField(choices=RunPriority.choices, help_text="urgent: admins and staff only.")
