"""`/api/review/campaigns/`: researchers manage campaigns: create, edit, open and close them, read their items,
results and agreement, export their judgements, mark gold items and start judge runs over them."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from posttrain.accounts.permissions import IsResearcher
from posttrain.accounts.selectors import signed_in_user
from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.core.api.negotiation import FileFormatNegotiation
from posttrain.core.errors import InvalidInput
from posttrain.projects.access import Access
from posttrain.projects.permissions import (
    ProjectAccess,
    ProjectScopedMixin,
    copy_target,
    require_same_project,
    target_project,
)
from posttrain.registry.api.serializers import DatasetSerializer
from posttrain.review import export, judging, selectors, services
from posttrain.review.api import serializers as s
from posttrain.review.models import Campaign
from posttrain.runs.api.params import text_param


@extend_schema_view(
    list=extend_schema(summary="Review campaigns", description="Filter with `state` (draft, active, closed)."),
    retrieve=extend_schema(
        summary="One campaign, with its questions, source and progress", responses=s.CampaignDetailSerializer
    ),
)
class CampaignViewSet(ProjectScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    permission_classes = [IsResearcher, ProjectAccess]
    # Registering an export reads the campaign and creates a dataset where copy_target allows.
    project_access = {"export_register": Access.READ}
    serializer_class = s.CampaignSerializer
    filterset_fields = ["state", "kind"]
    lookup_value_regex = r"\d+"

    def base_queryset(self):
        return selectors.campaign_list()

    def get_serializer_class(self):
        return s.CampaignSerializer if self.action == "list" else s.CampaignDetailSerializer

    def _detail(self, campaign: Campaign, status: int = 200) -> Response:
        return Response(s.CampaignDetailSerializer(selectors.campaign_list().get(pk=campaign.pk)).data, status=status)

    @extend_schema(
        summary="Create a campaign (a draft, its items already sampled from the runs)",
        description="Questions and source are validated in full; every problem comes back as `errors` naming its "
        "`loc` (`questions[1].max`, `source.runs[0]`, `annotators[0]`).",
        request=s.CampaignCreateSerializer,
        responses={201: s.CampaignDetailSerializer, 400: ERRORS_RESPONSE},
    )
    def create(self, request: Request) -> Response:
        project = target_project(request)
        body = s.CampaignCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        fields = {k: v for k, v in body.validated_data.items() if k != "project"}
        campaign = services.campaign_create(**fields, project=project, user=signed_in_user(request.user))
        return self._detail(campaign, status=201)

    @extend_schema(
        summary="Edit a campaign's texts and annotators",
        request=s.CampaignUpdateSerializer,
        responses={200: s.CampaignDetailSerializer, 400: ERRORS_RESPONSE},
    )
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        campaign = self.get_object()
        body = s.CampaignUpdateSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        services.campaign_update(campaign, **body.validated_data)
        return self._detail(campaign)

    @extend_schema(
        summary="Open the campaign to its annotators (draft → active)",
        request=None,
        responses={200: s.CampaignDetailSerializer, 409: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["post"])
    def activate(self, request: Request, pk: str | None = None) -> Response:
        return self._detail(services.campaign_activate(self.get_object()))

    @extend_schema(
        summary="Close the campaign (draft or active → closed)",
        request=None,
        responses={200: s.CampaignDetailSerializer, 409: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["post"])
    def close(self, request: Request, pk: str | None = None) -> Response:
        return self._detail(services.campaign_close(self.get_object()))

    @extend_schema(
        summary="The campaign's items in queue order (paginated)", responses=s.ReviewItemSerializer(many=True)
    )
    @action(detail=True, methods=["get"], filter_backends=[])
    def items(self, request: Request, pk: str | None = None) -> Response:
        page = self.paginate_queryset(selectors.campaign_items(self.get_object()))
        return self.get_paginated_response(s.ReviewItemSerializer(page, many=True).data)

    @extend_schema(
        summary="Judgements next to the rewards, per item (paginated)",
        description='Pairs: `reward_preferred` vs `human_preferred` ("A" = samples.A). Singles: `human_score` '
        "(first pass/fail pass rate, else first rating scaled to 0..1) vs `reward_rank` (the reward's standing "
        "among the campaign's items, 0..1). `disagrees` when they are ≥ 0.5 apart or name different samples.",
        parameters=[
            OpenApiParameter(
                "ordering",
                OpenApiTypes.STR,
                enum=list(selectors.RESULT_ORDERINGS),
                description="Default position; unknown values (no judgement, no reward) sort last.",
            ),
            OpenApiParameter("disagrees", OpenApiTypes.BOOL, description="true: only items flagged as disagreeing."),
        ],
        responses={200: s.ResultRowSerializer(many=True), 400: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["get"], filter_backends=[])
    def results(self, request: Request, pk: str | None = None) -> Response:
        campaign = self.get_object()
        ordering = text_param(request, "ordering") or "position"
        if ordering not in selectors.RESULT_ORDERINGS:
            raise InvalidInput.one(
                "ordering", f"must be one of {', '.join(selectors.RESULT_ORDERINGS)}, got {ordering[:50]!r}"
            )
        only = (text_param(request, "disagrees") or "").lower() in ("1", "true", "yes")
        rows = selectors.campaign_results(campaign, ordering=ordering, disagreements_only=only)
        return self.get_paginated_response(self.paginate_queryset(rows))

    @extend_schema(summary="Agreement per question and statistics per annotator", responses=s.AgreementSerializer)
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def agreement(self, request: Request, pk: str | None = None) -> Response:
        return Response(selectors.agreement(self.get_object()))

    @extend_schema(
        summary="Download the judgements as a file",
        description="trl and openai: preference pairs (pair campaigns; the items' plurality answer A or B; ties, "
        "both_bad and level votes give no pair). ratings_jsonl / ratings_csv: one row per judgement.",
        parameters=[
            OpenApiParameter("format", OpenApiTypes.STR, enum=list(export.EXPORT_FORMATS), required=True),
            OpenApiParameter(
                "question", OpenApiTypes.STR, description="trl/openai: the pairwise question key (default: the first)."
            ),
        ],
        responses={
            (200, "application/x-ndjson"): OpenApiTypes.STR,
            (200, "text/csv"): OpenApiTypes.STR,
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
    def export(self, request: Request, pk: str | None = None) -> HttpResponse:
        campaign = self.get_object()
        fmt = export.check_format(text_param(request, "format"))
        built = export.export_campaign(campaign, fmt, text_param(request, "question"))
        response = HttpResponse("".join(built.lines), content_type=export.EXPORT_FORMATS[fmt].content_type)
        response["Content-Disposition"] = f'attachment; filename="{export.export_filename(campaign, fmt)}"'
        return response

    @extend_schema(
        summary="Register an export as a registry dataset (lineage: source_campaign_id)",
        description="201 with the new dataset; 200 with the existing one when the same content was registered "
        "before. openai cannot be registered (its prompt is nested); register trl.",
        request=s.ExportRegisterSerializer,
        responses={201: DatasetSerializer, 200: DatasetSerializer, 400: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["post"], url_path="export/register")
    def export_register(self, request: Request, pk: str | None = None) -> Response:
        campaign = self.get_object()
        project = copy_target(request, campaign)
        body = s.ExportRegisterSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        dataset, created = export.campaign_export_register(
            campaign,
            data["format"],
            data["name"] or None,
            signed_in_user(request.user),
            project=project,
            description=data["description"],
            question=data["question"],
        )
        return Response(DatasetSerializer(dataset).data, status=201 if created else 200)

    @extend_schema(
        methods=["PUT"],
        summary="Mark an item as gold with its known answers (or change them)",
        description='Graded questions only (pass_fail, rating, pairwise with "A" = rollout_a, steps). A gold '
        "item is shown like any other, scores its annotators' accuracy and leaves the reviewers' queue.",
        request=s.GoldBodySerializer,
        responses={200: s.ReviewItemSerializer, 400: ERRORS_RESPONSE},
    )
    @extend_schema(
        methods=["DELETE"],
        summary="Unmark an owner-set gold item",
        request=None,
        responses={200: s.ReviewItemSerializer, 400: ERRORS_RESPONSE},
    )
    @action(
        detail=True,
        methods=["put", "delete"],
        url_path=r"items/(?P<item_id>\d+)/gold",
        pagination_class=None,
        filter_backends=[],
    )
    def gold(self, request: Request, pk: str | None = None, item_id: str | None = None) -> Response:
        campaign = self.get_object()
        item = get_object_or_404(campaign.items.select_related("campaign", "rollout_a"), pk=item_id)
        if request.method == "DELETE":
            answers = None
        else:
            body = s.GoldBodySerializer(data=request.data)
            body.is_valid(raise_exception=True)
            answers = body.validated_data["answers"]
            if answers is None:
                raise InvalidInput.one("answers", "give the known answers (DELETE unmarks the item)")
        services.item_gold_set(item, answers)
        return Response(s.ReviewItemSerializer(selectors.campaign_items(campaign).get(pk=item.pk)).data)

    @extend_schema(methods=["GET"], summary="The campaign's judge runs", responses=s.JudgeRunSerializer(many=True))
    @extend_schema(
        methods=["POST"],
        summary="Pre-score the campaign's items with a registered reward (a judge run, on a worker)",
        description="202: the run is queued; poll `GET /api/review/judge-runs/{id}/`. The worker scores every "
        "rollout the items show (user code runs in the sandbox, on the user_code queue).",
        request=s.JudgeCreateSerializer,
        responses={202: s.JudgeRunSerializer, 400: ERRORS_RESPONSE},
    )
    @action(detail=True, methods=["get", "post"], pagination_class=None, filter_backends=[])
    def judges(self, request: Request, pk: str | None = None) -> Response:
        campaign = self.get_object()
        if request.method == "GET":
            return Response(s.JudgeRunSerializer(selectors.judge_runs(campaign), many=True).data)
        body = s.JudgeCreateSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        require_same_project("reward", data["reward"], campaign.project)
        judge = judging.judge_run_create(
            campaign,
            data["reward"],
            signed_in_user(request.user),
            threshold=data["threshold"],
            score_min=data["score_min"],
            score_max=data["score_max"],
        )
        return Response(s.JudgeRunSerializer(judge).data, status=202)
