"""Comparing runs side by side: their curves on one x axis, the prompts they share and what each
answered to one prompt. Thin views over posttrain.telemetry.series and posttrain.telemetry.comparison."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from posttrain.accounts.permissions import IsResearcher
from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.core.errors import InvalidInput
from posttrain.projects.access import readable
from posttrain.runs.api.params import int_param, text_param
from posttrain.runs.models import Run
from posttrain.telemetry import comparison, rollouts
from posttrain.telemetry import series as run_series
from posttrain.telemetry.api import serializers as s
from posttrain.telemetry.api.chart_series import SERIES_PARAMETERS, ChartSeriesSerializer, series_query
from posttrain.telemetry.api.rollouts import GapSerializer

RUNS_PARAMETER = OpenApiParameter(
    "runs",
    OpenApiTypes.STR,
    required=True,
    description="Run ids, comma-separated or the parameter repeated; the answer keeps their order.",
)


class RunGapSerializer(GapSerializer):
    run = serializers.CharField(help_text="The run whose file it is.")


class CompareRunSerializer(serializers.ModelSerializer):
    experiment_name = serializers.CharField(source="experiment.name", read_only=True)
    config = serializers.JSONField(source="resolved_config", read_only=True)

    class Meta:
        model = Run
        fields = [
            "id",
            "name",
            "experiment",
            "experiment_name",
            "state",
            "seed",
            "tags",
            "created_at",
            "config",
            "summary",
        ]
        read_only_fields = fields


class ComparedRunSerializer(CompareRunSerializer):
    """A run in the compare answer (documentation: the view adds `series` to CompareRunSerializer's data)."""

    series = serializers.DictField(child=ChartSeriesSerializer(), help_text="Metric name to its chart series.")

    class Meta(CompareRunSerializer.Meta):
        fields = [*CompareRunSerializer.Meta.fields, "series"]
        read_only_fields = fields


_compare_response = inline_serializer(
    "Comparison",
    fields={
        "x_axis": serializers.ChoiceField(choices=list(run_series.X_AXES)),
        "runs": ComparedRunSerializer(many=True),
    },
)


class CompareView(APIView):
    permission_classes = [IsResearcher]

    @extend_schema(
        summary="Compare runs: their metadata, summaries and metric curves on one x axis",
        parameters=[RUNS_PARAMETER, *SERIES_PARAMETERS],
        responses={200: _compare_response, 400: ERRORS_RESPONSE},
    )
    def get(self, request: Request) -> Response:
        runs = comparison.runs_in_order(request.query_params.getlist("runs"), readable(Run.objects.all(), request.user))
        query = series_query(request)
        curves = run_series.runs_series(runs, query.names, query.x_axis, query.max_points)
        # One serializer for all runs: a ModelSerializer builds its fields per instance (1 ms each).
        described = CompareRunSerializer(runs, many=True).data
        return Response(
            {
                "x_axis": query.x_axis,
                "runs": [{**data, "series": curves[str(run.pk)].series} for run, data in zip(runs, described)],
            }
        )


class ComparePromptsView(APIView):
    permission_classes = [IsResearcher]

    @extend_schema(
        summary="Prompts every compared run sampled, with each run's sample count",
        description=f"Most recently stored first, at most {comparison.MAX_PROMPTS}.",
        parameters=[RUNS_PARAMETER, OpenApiParameter("q", OpenApiTypes.STR, description="Text in the prompt.")],
        responses={
            200: inline_serializer(
                "SharedPrompts",
                fields={
                    "prompts": serializers.ListField(
                        child=inline_serializer(
                            "SharedPrompt",
                            fields={
                                "prompt": serializers.CharField(),
                                "counts": serializers.DictField(
                                    child=serializers.IntegerField(), help_text="Run id to samples."
                                ),
                                "truncated": serializers.DictField(
                                    child=serializers.IntegerField(),
                                    help_text="{prompt: its full length} when the prompt shown was cut.",
                                ),
                            },
                        )
                    ),
                    "gaps": RunGapSerializer(many=True),
                },
            ),
            400: ERRORS_RESPONSE,
        },
    )
    def get(self, request: Request) -> Response:
        runs = comparison.runs_in_order(request.query_params.getlist("runs"), readable(Run.objects.all(), request.user))
        shared = comparison.shared_prompts(runs, text_param(request, "q"))
        return Response(
            {
                "prompts": [{"prompt": p.prompt, "counts": p.counts, "truncated": p.truncated} for p in shared.prompts],
                "gaps": rollouts.gaps_payload(shared.gaps, with_run=True),
            }
        )


class CompareSamplesView(APIView):
    permission_classes = [IsResearcher]

    @extend_schema(
        summary="What each compared run answered to one prompt",
        description="Without `step`, each run shows its latest step with that prompt (`step` null: never sampled).",
        parameters=[
            RUNS_PARAMETER,
            OpenApiParameter("prompt", OpenApiTypes.STR, required=True, description="The exact prompt."),
            OpenApiParameter("step", OpenApiTypes.INT),
        ],
        responses={
            200: inline_serializer(
                "PromptSamples",
                fields={
                    "runs": serializers.ListField(
                        child=inline_serializer(
                            "RunPromptSamples",
                            fields={
                                "id": serializers.UUIDField(),
                                "step": serializers.IntegerField(allow_null=True),
                                "samples": s.SampleSerializer(many=True),
                            },
                        )
                    ),
                    "gaps": RunGapSerializer(many=True),
                },
            ),
            400: ERRORS_RESPONSE,
        },
    )
    def get(self, request: Request) -> Response:
        runs = comparison.runs_in_order(request.query_params.getlist("runs"), readable(Run.objects.all(), request.user))
        prompt = request.query_params.get("prompt", "").replace("\x00", "")
        if not prompt:
            raise InvalidInput.one("prompt", "required: the exact prompt text")
        step = int_param(request, "step")
        gaps: list[rollouts.Gap] = []
        shown = comparison.samples_of_prompt(runs, prompt, step, gaps)
        return Response(
            {
                "runs": [
                    {
                        "id": str(item.run.pk),
                        "step": item.step,
                        "samples": item.samples,
                    }
                    for item in shown
                ],
                "gaps": rollouts.gaps_payload(rollouts.unique_gaps(gaps), with_run=True),
            }
        )
