"""`/api/runs/`: runs, their lifecycle (cancel, clone, resume), their checkpoints and state transitions. Thin views over
posttrain.runs' services and selectors; what runs reported (metrics, series, samples, logs) is served under the same
paths by posttrain.telemetry.api.run_reads, and a run's priority by posttrain.scheduling.api.views."""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import filters, mixins, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from posttrain.accounts.permissions import IsResearcher
from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.projects.access import Access, require_create
from posttrain.projects.permissions import ProjectAccess, ProjectScopedMixin, copy_target
from posttrain.registry.api.serializers import ModelAssetSerializer
from posttrain.registry.services import model_register_checkpoint
from posttrain.runs import selectors, services
from posttrain.runs.api import serializers as s
from posttrain.runs.models import Run, RunKind, RunState


class RunFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=RunState.choices)
    kind = django_filters.ChoiceFilter(choices=RunKind.choices, help_text="native (our engine) or external (tracked).")
    experiment = django_filters.NumberFilter(field_name="experiment_id")
    tag = django_filters.CharFilter(method="filter_tag", help_text="Runs carrying this tag.")
    parent = django_filters.UUIDFilter(field_name="parent_id")
    id_prefix = django_filters.CharFilter(
        method="filter_id_prefix",
        validators=[selectors.validate_run_id_prefix],
        help_text="Runs whose id starts with this (a short id, as the CLI shows it; dashes optional).",
    )

    class Meta:
        model = Run
        fields = ["state", "kind", "experiment", "tag", "parent", "id_prefix"]

    def filter_tag(self, queryset, name, value):
        return selectors.runs_with_tag(queryset, value)

    def filter_id_prefix(self, queryset, name, value):
        return selectors.runs_with_id_prefix(queryset, value)


# What every viewset on `/api/runs/<id>/` shares: who may call it, the run ids its paths take, the runs it reads. The
# endpoints of higher apps under a run (telemetry's reads, scheduling's priority) are viewsets of their own on the same
# route, derived from this one, since runs never imports them. (No docstrings on these classes: the API schema would
# take one as every operation's description.)
class RunRouteViewSet(ProjectScopedMixin, viewsets.GenericViewSet):
    permission_classes = [IsResearcher, ProjectAccess]
    lookup_value_regex = "[0-9a-fA-F-]{32,36}"
    # An action's OPTIONS answer describes this serializer, and its object is looked up through these filters:
    # the same for every action on the route, whichever app serves it.
    serializer_class = s.RunSerializer
    filter_backends = [django_filters.rest_framework.DjangoFilterBackend, filters.SearchFilter, filters.OrderingFilter]
    filterset_class = RunFilter
    search_fields = ["name", "note", "experiment__name"]
    ordering_fields = ["created_at", "state", "name", "finished_at", "last_step"]

    def base_queryset(self):
        return selectors.run_list()


@extend_schema_view(
    list=extend_schema(
        summary="Runs",
        description="Filter by state (repeatable), experiment, tag; `search` matches name, note and experiment name.",
    ),
    retrieve=extend_schema(summary="One run, with its resolved config", responses=s.RunDetailSerializer),
)
class RunViewSet(RunRouteViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    # Clones, resumes and registered checkpoints are the user's own new objects: they read the run, and check
    # the project they are made in (copy_target).
    project_access = {"clone": Access.READ, "resume": Access.READ, "register_checkpoint": Access.READ}

    def get_serializer_class(self):
        return s.RunDetailSerializer if self.action == "retrieve" else s.RunSerializer

    @extend_schema(
        summary="Edit a run's tags and note",
        request=s.RunUpdateSerializer,
        responses={200: s.RunDetailSerializer, 400: ERRORS_RESPONSE},
    )
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        body = s.RunUpdateSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        services.run_update(run, **body.validated_data)
        return Response(s.RunDetailSerializer(run).data)

    @extend_schema(summary="Cancel a run", request=None, responses={200: s.RunDetailSerializer, 409: ERRORS_RESPONSE})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        run = services.run_cancel(self.get_object(), user=request.user)
        return Response(s.RunDetailSerializer(run).data)

    @extend_schema(
        summary="A new run with this run's exact config",
        request=s.RunCloneSerializer,
        responses={201: s.RunDetailSerializer, 400: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["post"])
    def clone(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        project = copy_target(request, run)
        body = s.RunCloneSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        fields = {k: v for k, v in body.validated_data.items() if k != "project"}
        new = services.run_clone(run, project=project, user=request.user, **fields)
        return Response(s.RunDetailSerializer(new).data, status=201)

    @extend_schema(
        summary="A new run continuing this one from a checkpoint",
        request=s.RunResumeSerializer,
        responses={201: s.RunDetailSerializer, 400: ERRORS_RESPONSE, 409: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        require_create(request.user, run.project)  # a resume is the user's new run in the run's project
        body = s.RunResumeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        new = services.run_resume(run, body.validated_data["checkpoint"], user=request.user)
        return Response(s.RunDetailSerializer(new).data, status=201)

    @extend_schema(summary="Checkpoints of a run", responses=s.CheckpointSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def checkpoints(self, request: Request, pk: str | None = None) -> Response:
        return Response(s.CheckpointSerializer(selectors.run_checkpoints(self.get_object()), many=True).data)

    @extend_schema(
        summary="Register one of the run's checkpoints as a model (lineage kept)",
        request=s.CheckpointRegisterSerializer,
        responses={201: ModelAssetSerializer, 400: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["post"], url_path="register-checkpoint")
    def register_checkpoint(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        project = copy_target(request, run)
        body = s.CheckpointRegisterSerializer(data=request.data, context={"run": run})
        body.is_valid(raise_exception=True)
        checkpoint = body.validated_data["checkpoint"]
        model = model_register_checkpoint(
            run,
            checkpoint.step,
            checkpoint.path,
            body.validated_data.get("name"),
            project=project,
            user=request.user,
        )
        return Response(ModelAssetSerializer(model).data, status=201)

    @extend_schema(summary="State transitions of a run, with reasons", responses=s.RunTransitionSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def transitions(self, request: Request, pk: str | None = None) -> Response:
        return Response(s.RunTransitionSerializer(selectors.run_transitions(self.get_object()), many=True).data)
