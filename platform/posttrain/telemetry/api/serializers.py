"""Serializers of the telemetry API: shapes only (what the event endpoint documents)."""

from __future__ import annotations

from rest_framework import serializers


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
