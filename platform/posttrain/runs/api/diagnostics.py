"""Alerts of a run: the diagnostics rules (posttrain.runs.diagnostics) over its stored metric series."""

from __future__ import annotations

import math
from dataclasses import asdict

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from posttrain.accounts.permissions import IsResearcher
from posttrain.runs import diagnostics
from posttrain.runs.models import Run
from posttrain.runs.series import read_series


class AlertSerializer(serializers.Serializer):
    code = serializers.CharField(
        help_text="nonfinite, kl_blowup, entropy_collapse, length_runaway, "
        "truncation_rising or reward_saturation_length_shift."
    )
    severity = serializers.ChoiceField(choices=["warning", "critical"])
    metric = serializers.CharField()
    step = serializers.IntegerField(help_text="First step where the condition holds.")
    message = serializers.CharField()
    value = serializers.FloatField(allow_null=True, help_text="The metric at `step`; null when it was NaN/Inf.")


class RunAlertsSerializer(serializers.Serializer):
    alerts = AlertSerializer(many=True)


class RunAlertsView(APIView):
    permission_classes = [IsResearcher]

    @extend_schema(
        summary="Diagnostic alerts of a run",
        description="Known RL failure signs in the run's metrics (NaN/Inf losses, KL blow-up, entropy collapse, "
        "runaway length, rising truncation, reward saturated while length shifts), sorted by step.",
        responses={200: RunAlertsSerializer},
    )
    def get(self, request: Request, pk) -> Response:
        run = get_object_or_404(Run.objects.only("id"), pk=pk)
        # The column store: a long run's alerts cost a few block reads, not a scan of every step's row.
        stored, _, _ = read_series([run.pk], diagnostics.METRICS_USED)
        series = {
            name: (
                [int(step) for step in points.steps],
                [None if math.isnan(value) else value for value in points.values.tolist()],
            )
            for (_, name), points in stored.items()
        }
        return Response({"alerts": [asdict(alert) for alert in diagnostics.diagnose(series)]})
