"""The metric-series parameters the run series and compare endpoints share (`names`, `x`, `max_points`), and
one metric as a chart reads it."""

from __future__ import annotations

from dataclasses import dataclass

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request

from posttrain.core.errors import InvalidInput
from posttrain.runs.api.params import int_param, text_param
from posttrain.telemetry import series as run_series

MAX_SERIES_NAMES = 200


@dataclass(frozen=True)
class SeriesQuery:
    names: list[str] | None  # None: every metric
    x_axis: str
    max_points: int


def series_query(request: Request) -> SeriesQuery:
    """`names`, `x` and `max_points` of the series and compare endpoints."""
    names = [n.strip() for n in (text_param(request, "names") or "").split(",") if n.strip()]
    if len(names) > MAX_SERIES_NAMES:
        raise InvalidInput.one("names", f"at most {MAX_SERIES_NAMES} metric names per request")
    x_axis = text_param(request, "x") or "step"
    if x_axis not in run_series.X_AXES:
        raise InvalidInput.one("x", f"must be one of {', '.join(run_series.X_AXES)}, got {x_axis[:50]!r}")
    max_points = int_param(request, "max_points")
    if max_points is None:
        max_points = run_series.DEFAULT_MAX_POINTS
    elif not run_series.MIN_MAX_POINTS <= max_points <= run_series.MAX_MAX_POINTS:
        raise InvalidInput.one(
            "max_points", f"must be between {run_series.MIN_MAX_POINTS} and {run_series.MAX_MAX_POINTS}"
        )
    return SeriesQuery(list(dict.fromkeys(names)) or None, x_axis, max_points)


SERIES_PARAMETERS = [
    OpenApiParameter("names", OpenApiTypes.STR, description="Comma-separated metric names; default: all."),
    OpenApiParameter(
        "x",
        OpenApiTypes.STR,
        enum=list(run_series.X_AXES),
        description="x axis: step, samples (progress/samples at the step), tokens (progress/tokens) "
        "or time (seconds since the run's first metrics event). Default step.",
    ),
    OpenApiParameter(
        "max_points",
        OpenApiTypes.INT,
        description=f"Points per series at most ({run_series.MIN_MAX_POINTS}.."
        f"{run_series.MAX_MAX_POINTS}, default {run_series.DEFAULT_MAX_POINTS}); longer series are "
        "downsampled (M4: first, min, max, last per bucket).",
    ),
]


class ChartSeriesSerializer(serializers.Serializer):
    """One metric as a chart reads it (documentation of the series and compare answers)."""

    x = serializers.ListField(child=serializers.FloatField())
    y = serializers.ListField(child=serializers.FloatField(allow_null=True), help_text="null: not finite (a gap).")
    step = serializers.ListField(child=serializers.IntegerField())
    points = serializers.IntegerField(help_text="Points stored (before downsampling).")
    downsampled = serializers.BooleanField()


RUN_SERIES_RESPONSE = inline_serializer(
    "RunSeries",
    fields={
        "run": serializers.UUIDField(),
        "x_axis": serializers.ChoiceField(choices=list(run_series.X_AXES)),
        "last_seq": serializers.IntegerField(help_text="Highest seq of a metrics event included."),
        "series": serializers.DictField(child=ChartSeriesSerializer(), help_text="Metric name to its chart series."),
    },
)
