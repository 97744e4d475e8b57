"""Alerts of a run: the diagnostics rules (posttrain.runs.diagnostics) over its stored metric series."""

from __future__ import annotations

from dataclasses import asdict

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from posttrain.accounts.permissions import IsResearcher
from posttrain.projects.access import Access
from posttrain.projects.permissions import object_for
from posttrain.runs.models import Run
from posttrain.telemetry.alerts import run_alerts


class AlertSerializer(serializers.Serializer):
    code = serializers.CharField(
        help_text="nonfinite, reward_errors, kl_blowup, entropy_collapse, entropy_blowup, length_runaway, "
        "truncation_rising, mismatch_kl_rising, reward_saturation_length_shift; reward-hacking signals: "
        "train_heldout_divergence, reward_with_length, component_carries_reward, repetition_rising, "
        "gibberish_rising, compression_rising, zero_advantage_rising, format_only_pattern (docs/REWARD_HACKING.md)."
    )
    severity = serializers.ChoiceField(choices=["warning", "critical"])
    metric = serializers.CharField()
    step = serializers.IntegerField(help_text="First step where the condition holds.")
    message = serializers.CharField()
    value = serializers.FloatField(allow_null=True, help_text="The metric at `step`; null when it was NaN/Inf.")
    examples_rule = serializers.CharField(
        allow_null=True, help_text="How the example rollouts were picked (null: the alert names none)."
    )
    examples = serializers.ListField(
        child=serializers.IntegerField(),
        allow_null=True,
        help_text="Indices of rollouts of `step` that show the problem (the run's samples at that step).",
    )


class RunAlertsSerializer(serializers.Serializer):
    alerts = AlertSerializer(many=True)


class RunAlertsView(APIView):
    permission_classes = [IsResearcher]

    @extend_schema(
        summary="Diagnostic alerts of a run",
        description="Known RL failure signs in the run's metrics (NaN/Inf losses, KL blow-up, entropy collapse, "
        "runaway length, rising truncation, reward saturated while length shifts) and reward-hacking signals "
        "(training reward up while held-out falls, reward following length, one component carrying the reward, "
        "repetition, gibberish, tied groups, a format-only answer spreading), sorted by step; a signal names "
        "example rollouts of its step.",
        responses={200: RunAlertsSerializer},
    )
    def get(self, request: Request, pk) -> Response:
        run = object_for(request, Run.objects.only("id", "project_id"), Access.READ, pk=pk)
        return Response({"alerts": [asdict(alert) for alert in run_alerts(run.pk)]})
