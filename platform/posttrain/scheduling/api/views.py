"""REST API of the scheduler: the queue, its metrics as JSON and for Prometheus, and a run's priority
(`POST /api/runs/<id>/priority/`). Thin views over posttrain.scheduling's selectors, metrics and services."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from posttrain.accounts.permissions import IsResearcher
from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.core.api.negotiation import FileFormatNegotiation
from posttrain.core.errors import InvalidInput
from posttrain.runs import selectors as run_selectors
from posttrain.runs.api import serializers as run_s
from posttrain.runs.api.params import float_param
from posttrain.runs.api.runs import RunRouteViewSet
from posttrain.scheduling.api import serializers as s
from posttrain.scheduling.metrics import DEFAULT_WINDOW_S, MAX_WINDOW_S, MIN_WINDOW_S, queue_metrics
from posttrain.scheduling.prometheus import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from posttrain.scheduling.prometheus import exposition
from posttrain.scheduling.selectors import queue_overview
from posttrain.scheduling.services import run_set_priority


class QueueView(APIView):
    """`GET /api/queue/`: the scheduler's queue, its running runs and the cluster (the /queue/ page)."""

    permission_classes = [IsResearcher]  # researchers and admins: annotators never see the queue

    @extend_schema(
        summary="The run queue",
        description="`waiting`: queued and preempted runs in admission order (`queue_position` 1 starts next; null: "
        "held, see `reason`), each with owner, priority, resources, why it waits and an estimated start from the "
        "running runs' pace (null: unknown). `running`: runs holding resources, with their grants. `cluster`: the "
        "Ray cluster's nodes with total and free CPUs/GPUs, as the last admission pass saw them (`as_of`).",
        responses={200: s.QueueSerializer},
    )
    def get(self, request: Request) -> Response:
        return Response(s.QueueSerializer(queue_overview(request.user)).data)


WINDOW_PARAMETER = OpenApiParameter(
    "window_s",
    OpenApiTypes.NUMBER,
    description=f"The window in seconds, {MIN_WINDOW_S:g} to {MAX_WINDOW_S:g} (default {DEFAULT_WINDOW_S:g}: a day).",
)


def _window(request: Request) -> float:
    window = float_param(request, "window_s")
    if window is None:
        return DEFAULT_WINDOW_S
    if not MIN_WINDOW_S <= window <= MAX_WINDOW_S:
        raise InvalidInput.one("window_s", f"must be between {MIN_WINDOW_S:g} and {MAX_WINDOW_S:g} seconds")
    return window


class QueueStatsView(APIView):
    """`GET /api/queue/stats/`: the scheduler's metrics over a window (the /queue/ page's panel)."""

    permission_classes = [IsResearcher]  # researchers and admins: annotators never see the queue

    @extend_schema(
        summary="The scheduler's metrics over a window",
        description="`queue_wait`: per priority, admissions in the window with the p50 and p95 of their wait (s). "
        "`admission_to_first_step`: the same for the time from a run's first admission to its first step. "
        "`utilisation`: the cluster's CPUs and GPUs granted by the platform and used as Ray reported, as fractions "
        "of capacity over the window and as a `series` over time. `preemptions`: asked in the window, `forced` "
        "(stopped at the deadline) and their `lost_steps`. `shares`: each user's, team's (`teams`: groups with a "
        "quota) and project's (`projects`: those you read, with a quota) share of the decayed usage against its "
        "share of the weights. `totals`: preemptions and lost steps ever.",
        parameters=[WINDOW_PARAMETER],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request) -> Response:
        return Response(queue_metrics(_window(request), viewer=request.user))


class QueueMetricsView(APIView):
    """`GET /api/queue/metrics`: the same metrics in Prometheus's text format, for a lab's own dashboards."""

    permission_classes = [IsResearcher]  # researchers and admins: annotators never see the queue
    content_negotiation_class = FileFormatNegotiation  # Prometheus asks for its own types; errors answer JSON

    @extend_schema(
        summary="The scheduler's metrics for Prometheus",
        description="Prometheus text exposition format (0.0.4): `posttrain_queue_wait_seconds{priority,quantile}`, "
        "`posttrain_admission_to_first_step_seconds{quantile}`, `posttrain_queue_waiting_runs`, "
        "`posttrain_cluster_utilisation_ratio{resource,kind}`, `posttrain_preemptions_total{forced}`, "
        "`posttrain_preemption_lost_steps_total`, `posttrain_fair_share_ratio{kind,name,of}`. Scrape it with an "
        "API token (`authorization: {type: Token, credentials: …}` in the scrape config).",
        parameters=[WINDOW_PARAMETER],
        responses={(200, "text/plain"): OpenApiTypes.STR},
    )
    def get(self, request: Request) -> HttpResponse:
        figures = queue_metrics(_window(request), viewer=request.user)
        return HttpResponse(exposition(figures), content_type=PROMETHEUS_CONTENT_TYPE)


# `/api/runs/<id>/priority/`: a second viewset on the runs route (posttrain.runs.api.runs), here because runs, the
# lower app, never imports scheduling. (No docstring: the API schema would take it as the operation's description.)
class RunPriorityViewSet(RunRouteViewSet):
    @extend_schema(
        summary="Change a run's priority (the queue is ordered again at once)",
        description="The run's owner may set low, normal or high; admins and staff any, urgent included.",
        request=s.RunPrioritySerializer,
        responses={200: run_s.RunDetailSerializer, 400: ERRORS_RESPONSE, 409: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["post"])
    def priority(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        body = s.RunPrioritySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = run_set_priority(run, body.validated_data["priority"], user=request.user)
        return Response(run_s.RunDetailSerializer(run_selectors.run_list().get(pk=run.pk)).data)
