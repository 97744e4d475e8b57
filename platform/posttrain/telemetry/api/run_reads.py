"""What a run reported, under `/api/runs/<id>/`: its metrics, chart series and raw export, rollout samples and their
per-token view, and its logs. The same paths, names and schema as the rest of `/api/runs/` (posttrain.runs.api.runs):
a second viewset on the runs route, here because runs, the lower app, never imports telemetry."""

from __future__ import annotations

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.core.api.negotiation import FileFormatNegotiation
from posttrain.core.errors import InvalidInput
from posttrain.runs.api.params import float_param, int_param, text_param
from posttrain.runs.api.runs import RunRouteViewSet
from posttrain.telemetry import rollouts, selectors
from posttrain.telemetry import series as run_series
from posttrain.telemetry.api import serializers as s
from posttrain.telemetry.api.chart_series import RUN_SERIES_RESPONSE, SERIES_PARAMETERS, series_query
from posttrain.telemetry.event_schema import MAX_INT32

MAX_SAMPLES_PAGE = 500


def _with_query(request: Request, **changes: int) -> str:
    """This request's path with some query parameters replaced (a page's next/previous link)."""
    query = request.query_params.copy()
    for key, value in changes.items():
        query[key] = str(value)
    return f"{request.path}?{query.urlencode()}"


# What a run reported, on its route (the module says why here; no docstring: the API schema would show it).
class RunReadsViewSet(RunRouteViewSet):
    @extend_schema(
        summary="Metric series of a run",
        parameters=[
            OpenApiParameter("names", OpenApiTypes.STR, description="Comma-separated metric names; default: all."),
            OpenApiParameter("step_min", OpenApiTypes.INT),
            OpenApiParameter("step_max", OpenApiTypes.INT),
        ],
        responses={200: s.MetricsSerializer, 400: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        names = [n.strip() for n in (text_param(request, "names") or "").split(",") if n.strip()]
        if len(names) > 200:
            raise InvalidInput.one("names", "at most 200 metric names per request")
        series = selectors.run_metric_series(
            run, names or None, int_param(request, "step_min"), int_param(request, "step_max")
        )
        return Response({"series": series})

    @extend_schema(
        summary="Rollout samples of a run (paginated; read from the run's rollout files)",
        description="`count` is null when only reading every file could tell it (a filter other than `step`): "
        "page with `next`. `gaps` names the steps whose rollout file is missing or cannot be read. Texts and "
        "lists are cut to a fixed size; `truncated` gives the full length of each one cut.",
        parameters=[
            OpenApiParameter("step", OpenApiTypes.INT),
            OpenApiParameter("min_reward", OpenApiTypes.FLOAT),
            OpenApiParameter("max_reward", OpenApiTypes.FLOAT),
            OpenApiParameter("min_advantage", OpenApiTypes.FLOAT),
            OpenApiParameter("max_advantage", OpenApiTypes.FLOAT),
            OpenApiParameter("min_length", OpenApiTypes.INT, description="Response length in tokens, at least."),
            OpenApiParameter("max_length", OpenApiTypes.INT, description="Response length in tokens, at most."),
            OpenApiParameter("finish_reason", OpenApiTypes.STR, description="stop or length"),
            OpenApiParameter("q", OpenApiTypes.STR, description="Text in the prompt, response or label (any case)."),
            OpenApiParameter("group", OpenApiTypes.INT, description="One prompt group of the step (GRPO)."),
            OpenApiParameter("prompt", OpenApiTypes.STR, description="The exact prompt, across steps."),
            OpenApiParameter("limit", OpenApiTypes.INT, description=f"At most {MAX_SAMPLES_PAGE} (default 50)."),
            OpenApiParameter("offset", OpenApiTypes.INT),
        ],
        responses={200: s.SamplePageSerializer, 400: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def samples(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        step = int_param(request, "step")
        filters = rollouts.RolloutFilter(
            steps=None if step is None else [step],
            min_reward=float_param(request, "min_reward"),
            max_reward=float_param(request, "max_reward"),
            min_advantage=float_param(request, "min_advantage"),
            max_advantage=float_param(request, "max_advantage"),
            min_length=int_param(request, "min_length", low=0, high=MAX_INT32),
            max_length=int_param(request, "max_length", low=0, high=MAX_INT32),
            finish_reason=text_param(request, "finish_reason"),
            q=text_param(request, "q"),
            group=int_param(request, "group"),
            prompt=text_param(request, "prompt"),
        )
        limit = int_param(request, "limit") or 50
        offset = int_param(request, "offset") or 0
        if not 1 <= limit <= MAX_SAMPLES_PAGE:
            raise InvalidInput.one("limit", f"must be between 1 and {MAX_SAMPLES_PAGE}")
        if offset < 0:
            raise InvalidInput.one("offset", "must be 0 or more")
        listing = rollouts.run_rollout_files(run)
        present = {(str(run.pk), f["name"]) for f in listing.files if f["available"]}
        gaps = list(listing.gaps)  # and the files the page's queries could not read
        # One row more than the page says whether there is a next page without counting every match.
        rows = list(
            rollouts.rollouts_query(
                [run.pk], filters=filters, limit=limit + 1, offset=offset, present=present, gaps=gaps
            )
        )
        count = rollouts.rollouts_count([run.pk], filters, present, gaps)
        more = len(rows) > limit
        page_url = request.build_absolute_uri
        return Response(
            {
                "count": count,
                "next": page_url(_with_query(request, offset=offset + limit, limit=limit)) if more else None,
                "previous": page_url(_with_query(request, offset=max(0, offset - limit), limit=limit))
                if offset
                else None,
                "results": rows[:limit],
                "gaps": rollouts.gaps_payload(rollouts.unique_gaps(gaps)),
            }
        )

    @extend_schema(
        summary="One sample's per-token view and the same prompt's responses across steps",
        parameters=[
            OpenApiParameter("step", OpenApiTypes.INT, required=True),
            OpenApiParameter("index", OpenApiTypes.INT, required=True),
        ],
        responses={200: s.SampleTokensSerializer, 400: ERRORS_RESPONSE, 404: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["get"], url_path="sample-tokens", pagination_class=None, filter_backends=[])
    def sample_tokens(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        step, index = int_param(request, "step"), int_param(request, "index")
        missing = [
            {"loc": name, "msg": "required"} for name, value in (("step", step), ("index", index)) if value is None
        ]
        if missing or step is None or index is None:
            raise InvalidInput(missing)
        view = rollouts.rollout_token_view(run.pk, step, index)
        return Response(s.SampleTokensSerializer(view).data)

    @extend_schema(
        summary="Logs of the run's Ray job",
        parameters=[
            OpenApiParameter("tail", OpenApiTypes.INT, description="Characters from the end (default 200000).")
        ],
        responses={200: s.RunLogsSerializer, 503: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def logs(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        tail = int_param(request, "tail")
        if tail is not None and tail < 1:
            raise InvalidInput.one("tail", "must be at least 1")
        return Response(selectors.run_job_logs(run, tail or selectors.DEFAULT_LOG_TAIL_CHARS))

    @extend_schema(
        summary="Metric series of a run for charts (downsampled on the server)",
        description="Each series: `x` on the chosen axis, `y` (null where the value was not finite), `step`, "
        "`points` (stored points) and `downsampled`. `last_seq`: the highest metrics event seq included; live "
        "events after it extend the curves.",
        parameters=SERIES_PARAMETERS,
        responses={200: RUN_SERIES_RESPONSE, 400: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def series(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        query = series_query(request)
        found = run_series.runs_series([run], query.names, query.x_axis, query.max_points)[str(run.pk)]
        return Response(
            {"run": str(run.pk), "x_axis": query.x_axis, "last_seq": found.last_seq, "series": found.series}
        )

    @extend_schema(
        summary="Download the raw per-step metrics (CSV or JSON lines)",
        description="Every stored metrics event in step order. CSV: `step,time,<metric names sorted>`, non-finite "
        'values as nan/inf, empty where a step has no value. JSONL: one `{"step", "time", "values"}` per line.',
        parameters=[
            OpenApiParameter(
                "format", OpenApiTypes.STR, enum=list(run_series.EXPORT_FORMATS), description="csv (default) or jsonl"
            )
        ],
        responses={
            (200, "text/csv"): OpenApiTypes.STR,
            (200, "application/x-ndjson"): OpenApiTypes.STR,
            400: ERRORS_RESPONSE,
        },
    )
    @action(
        detail=True,
        methods=["get"],
        pagination_class=None,
        filter_backends=[],
        content_negotiation_class=FileFormatNegotiation,
    )
    def export(self, request: Request, pk: str | None = None) -> StreamingHttpResponse:
        run = self.get_object()
        kind = text_param(request, "format") or "csv"
        if kind not in run_series.EXPORT_FORMATS:
            raise InvalidInput.one(
                "format", f"must be one of {', '.join(run_series.EXPORT_FORMATS)}, got {kind[:50]!r}"
            )
        content_type, lines = run_series.EXPORT_FORMATS[kind]
        response = StreamingHttpResponse(lines(run), content_type=content_type)
        response["Content-Disposition"] = f'attachment; filename="{run_series.export_filename(run, kind)}"'
        return response
