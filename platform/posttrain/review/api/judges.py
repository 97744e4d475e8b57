"""`/api/review/judge-runs/`: judge runs (a registered reward scoring rollouts), their agreement with the humans
and registering a judge's reward."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from posttrain.accounts.permissions import IsResearcher
from posttrain.accounts.selectors import signed_in_user
from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.projects.access import Access
from posttrain.projects.permissions import (
    ProjectAccess,
    ProjectScopedMixin,
    copy_target,
    require_same_project,
    target_project,
)
from posttrain.registry.api.serializers import RewardFunctionSerializer
from posttrain.review import judging, selectors
from posttrain.review.api import serializers as s
from posttrain.review.models import JudgeRun
from posttrain.runs.api.params import text_param


@extend_schema_view(
    list=extend_schema(summary="Judge runs", description="Filter with `campaign` (an id) or `pool=true`."),
    retrieve=extend_schema(summary="One judge run: state and progress"),
)
class JudgeRunViewSet(ProjectScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    permission_classes = [IsResearcher, ProjectAccess]
    # Registering a judge's reward reads the judge run and creates a reward where copy_target allows.
    project_access = {"register": Access.READ}
    serializer_class = s.JudgeRunSerializer
    filterset_fields = ["campaign", "state"]
    lookup_value_regex = r"\d+"

    def base_queryset(self):
        runs = selectors.judge_runs()
        if (text_param(self.request, "pool") or "").lower() in ("1", "true", "yes"):
            runs = runs.filter(campaign__isnull=True)
        return runs

    @extend_schema(
        summary="Score runs' rollouts with a registered reward (a pool for the reward_vs_judge rule)",
        description="202: queued on a worker. A campaign created with `source.rule` reward_vs_judge and "
        "`source.judge_run` this id then picks the rollouts where the reward and this judge disagree most.",
        request=s.JudgePoolCreateSerializer,
        responses={202: s.JudgeRunSerializer, 400: ERRORS_RESPONSE},
    )
    def create(self, request: Request) -> Response:
        project = target_project(request)
        body = s.JudgePoolCreateSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        require_same_project("reward", data["reward"], project)
        judge = judging.judge_pool_create(
            data["reward"],
            data["source"],
            signed_in_user(request.user),
            project=project,
            threshold=data["threshold"],
            score_min=data["score_min"],
            score_max=data["score_max"],
        )
        return Response(s.JudgeRunSerializer(judge).data, status=202)

    @extend_schema(
        summary="The judge's agreement with the humans, per question",
        description="Cohen's kappa (quadratic-weighted for ratings), raw agreement, true/false positive rates "
        "with the humans as the truth (pass; a rating above the midpoint; pairwise per side), the confusion "
        "counts, and the items it gets wrong. Humans: each item's label (gold, decision, weighted vote).",
        responses=OpenApiTypes.OBJECT,
    )
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def agreement(self, request: Request, pk: str | None = None) -> Response:
        return Response(selectors.judge_agreement(self.get_object()))

    @extend_schema(
        summary="Register the judge's reward under a new name, with its measured agreement",
        description="Refused unless the judge ran over a campaign, finished, and its kappa with the humans is at "
        f"least {judging.MIN_REGISTER_KAPPA}. The new reward's description carries the figures.",
        request=s.JudgeRegisterSerializer,
        responses={201: RewardFunctionSerializer, 400: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["post"])
    def register(self, request: Request, pk: str | None = None) -> Response:
        judge: JudgeRun = self.get_object()
        project = copy_target(request, judge)
        body = s.JudgeRegisterSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        reward = judging.judge_register_reward(
            judge,
            body.validated_data["name"],
            selectors.judge_agreement(judge),
            question=body.validated_data["question"],
            project=project,
            user=signed_in_user(request.user),
        )
        return Response(RewardFunctionSerializer(reward).data, status=201)
