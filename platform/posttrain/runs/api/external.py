"""`POST /api/runs/external/`: a run of another engine (TRL, OpenRLHF, verl, a loop of one's own), tracked through
the SDK."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from posttrain.accounts.permissions import IsResearcher
from posttrain.projects.permissions import target_project
from posttrain.runs import selectors, services
from posttrain.runs.api import serializers as s


class ExternalRunCreateView(APIView):
    """`POST /api/runs/external/`: the SDK's `posttrain.init()`."""

    permission_classes = [IsResearcher]

    @extend_schema(
        summary="Track an external run (TRL, OpenRLHF, verl, your own loop)",
        description="Creates a running run in `experiment` (an experiment without a model in `project`, made on "
        "first use) with no Ray job. The client posts its events to `events_url` with `ingest_token` (the engine's protocol): "
        "metrics, samples, logs, heartbeats, and a final status. A run whose client sends nothing for "
        "POSTTRAIN_RUN_HEARTBEAT_TIMEOUT_S fails as lost.",
        request=s.ExternalRunCreateSerializer,
        responses={201: s.ExternalRunCreatedSerializer},
    )
    def post(self, request: Request) -> Response:
        project = target_project(request)
        body = s.ExternalRunCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        fields = {k: v for k, v in body.validated_data.items() if k != "project"}
        created = services.external_run_create(project=project, user=request.user, **fields)
        run = selectors.run_list().get(pk=created.run.pk)
        return Response(
            {
                "run": s.RunDetailSerializer(run).data,
                "events_url": request.build_absolute_uri(f"/api/runs/{run.pk}/events"),
                "ingest_token": created.ingest_token,
            },
            status=201,
        )
