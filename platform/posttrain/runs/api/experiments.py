"""`/api/experiments/`: experiments, their runs' launch, and their settings. Thin views over posttrain.runs.services
and selectors."""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import filters, mixins, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from posttrain.accounts.permissions import IsResearcher
from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.projects.access import Access
from posttrain.projects.permissions import ProjectAccess, ProjectScopedMixin, target_project
from posttrain.runs import selectors, services
from posttrain.runs.api import serializers as s


@extend_schema_view(
    list=extend_schema(summary="Experiments"),
    retrieve=extend_schema(summary="One experiment"),
)
class ExperimentViewSet(ProjectScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    permission_classes = [IsResearcher, ProjectAccess]
    # A launch makes the user's own run in the experiment's project; it changes nothing of the experiment.
    project_access = {"launch": Access.CREATE}
    serializer_class = s.ExperimentSerializer
    filter_backends = [django_filters.rest_framework.DjangoFilterBackend, filters.SearchFilter, filters.OrderingFilter]
    filterset_fields = ["model", "dataset"]
    search_fields = ["name", "description"]
    ordering_fields = ["created_at", "name"]

    def base_queryset(self):
        return selectors.experiment_list()

    @extend_schema(
        summary="Create an experiment",
        description="The config is validated by the engine's schema, completed with the registry's model, "
        "dataset and rewards; invalid fields come back as `errors` naming each `loc`.",
        request=s.ExperimentCreateSerializer,
        responses={201: s.ExperimentSerializer, 400: ERRORS_RESPONSE},
    )
    def create(self, request: Request) -> Response:
        project = target_project(request)
        body = s.ExperimentCreateSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        experiment = services.experiment_create(
            project=project,
            name=data["name"],
            description=data["description"],
            model=data["model"],
            dataset=data["dataset"],
            rewards=[(item["reward"], item["weight"]) for item in data["rewards"]],
            config=data["config"],
            user=request.user,
            webhook_url=data["webhook_url"],
        )
        return Response(s.ExperimentSerializer(selectors.experiment_list().get(pk=experiment.pk)).data, status=201)

    @extend_schema(
        summary="Set an experiment's alert webhook",
        description="Where its runs' critical alerts are POSTed (JSON: Slack's `text` plus `run` and `alert`), by "
        "a Celery task that retries with backoff; checked now and at every POST by the outbound policy. Empty: none.",
        request=s.ExperimentUpdateSerializer,
        responses={200: s.ExperimentSerializer, 400: ERRORS_RESPONSE},
    )
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        experiment = self.get_object()
        body = s.ExperimentUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.experiment_set_webhook(experiment, body.validated_data["webhook_url"])
        return Response(s.ExperimentSerializer(selectors.experiment_list().get(pk=experiment.pk)).data)

    @extend_schema(
        summary="Launch a run of the experiment",
        request=s.RunLaunchSerializer,
        responses={201: s.RunDetailSerializer, 400: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["post"])
    def launch(self, request: Request, pk: str | None = None) -> Response:
        experiment = self.get_object()
        body = s.RunLaunchSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = services.run_launch(experiment, user=request.user, **body.validated_data)
        return Response(s.RunDetailSerializer(run).data, status=201)
