"""REST API of review: thin views over posttrain.review services, selectors, judging and export.

Researchers and admins manage campaigns (CampaignViewSet, AnnotatorListView, ReviewerListView) and judges
(JudgeRunViewSet, the campaign's `judges`). Annotators and admins work their queue (QueueView and the item
views); reviewers and admins adjudicate (AdjudicationQueueView, CampaignAdjudicateNextView,
ItemDecisionView). Annotators and reviewers reach only campaigns they are assigned to: anything else is a
404, as if it did not exist.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from posttrain.accounts.permissions import IsAnnotator, IsResearcher, IsReviewer
from posttrain.accounts.roles import Role
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
from posttrain.registry.api.serializers import DatasetSerializer, RewardFunctionSerializer
from posttrain.review import export, judging, selectors, services
from posttrain.review.api import serializers as s
from posttrain.review.models import Campaign, JudgeRun, ReviewItem
from posttrain.review.questions import swap_pairwise
from posttrain.runs.api.params import text_param

# --- researchers ----------------------------------------------------------------------------------


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


def _people_with_role(role: str) -> Response:
    users = get_user_model().objects.filter(is_active=True, groups__name=role).order_by("username").distinct()
    return Response([{"id": user.pk, "username": user.get_username()} for user in users])


class AnnotatorListView(APIView):
    permission_classes = [IsResearcher]

    @extend_schema(
        summary="Users who may be assigned to campaigns (annotator role)", responses=s.AnnotatorSerializer(many=True)
    )
    def get(self, request: Request) -> Response:
        return _people_with_role(Role.ANNOTATOR)


class ReviewerListView(APIView):
    permission_classes = [IsResearcher]

    @extend_schema(
        summary="Users who may adjudicate campaigns (reviewer role)", responses=s.AnnotatorSerializer(many=True)
    )
    def get(self, request: Request) -> Response:
        return _people_with_role(Role.REVIEWER)


# --- judges ---------------------------------------------------------------------------------------


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


# --- annotators -----------------------------------------------------------------------------------


def _next_payload(campaign: Campaign, request: Request) -> dict[str, Any] | None:
    """Claim the user's next item of the campaign: the payload the page shows, or None when none is left."""
    item = services.item_claim_next(campaign, signed_in_user(request.user))
    if item is None:
        return None
    return {
        "campaign": selectors.campaign_for_annotator(campaign),
        "item": selectors.item_for_annotator(item, signed_in_user(request.user)),
        "progress": selectors.annotator_progress(campaign, signed_in_user(request.user)),
    }


class _AnnotatorView(APIView):
    permission_classes = [IsAnnotator]

    def _item(self, request: Request, pk: int) -> ReviewItem:
        return get_object_or_404(selectors.annotator_items(signed_in_user(request.user)), pk=pk)


class QueueView(_AnnotatorView):
    @extend_schema(summary="My active campaigns, with my progress in each", responses=s.QueueEntrySerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(
            [
                {
                    **selectors.campaign_for_annotator(campaign),
                    "description": campaign.description,
                    "progress": progress,
                }
                for campaign, progress in selectors.annotator_queue(signed_in_user(request.user))
            ]
        )


class CampaignNextView(_AnnotatorView):
    @extend_schema(
        summary="Claim my next item (locked to me for the campaign's lock_ttl_s)",
        description="The item I hold already comes back first (lock renewed). Unskipped items before skipped ones; "
        "never an item I judged; never one another annotator holds. 204 when nothing is available to me now "
        "(`GET /api/review/queue/` tells done from waiting on others' locks). Blind campaigns show no reward, "
        "components, run, step or sample id.",
        request=None,
        responses={
            200: s.NextItemSerializer,
            204: OpenApiResponse(description="Nothing left for me now."),
            404: ERRORS_RESPONSE,
            409: ERRORS_RESPONSE,
        },
    )
    def post(self, request: Request, pk: int) -> Response:
        campaign = get_object_or_404(selectors.annotator_campaigns(signed_in_user(request.user)), pk=pk)
        payload = _next_payload(campaign, request)
        return Response(status=204) if payload is None else Response(payload)


class ItemJudgementView(_AnnotatorView):
    @extend_schema(
        summary="Submit my answers on an item (again: replaces my answers)",
        description="Pairwise answers name the responses as shown (A is the first shown). Needs the item free "
        "for me: I hold its lock, or nobody holds an unexpired one. Releases the lock. With `claim_next`, the "
        "response carries my next item (`next`, null when none) so the page needs one request per item.",
        request=s.JudgementBodySerializer,
        responses={
            201: s.JudgementResponseSerializer,
            200: s.JudgementResponseSerializer,
            400: ERRORS_RESPONSE,
            404: ERRORS_RESPONSE,
            409: ERRORS_RESPONSE,
        },
    )
    def post(self, request: Request, pk: int) -> Response:
        item = self._item(request, pk)
        body = s.JudgementBodySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        judgement, created = services.judgement_submit(
            item, signed_in_user(request.user), data["answers"], data["seconds"]
        )
        payload: dict[str, Any] = {
            "judgement": {
                "item": item.pk,
                "answers": swap_pairwise(item.campaign.questions, judgement.answers, item.display_swap),
                "seconds": judgement.seconds,
                "created_at": judgement.created_at,
                "updated_at": judgement.updated_at,
            },
            "created": created,
        }
        if data["claim_next"]:
            payload["next"] = _next_payload(item.campaign, request)
        # The progress after the next item was claimed, read once for both (the page's one request per item).
        payload["progress"] = (
            payload["next"]["progress"]
            if payload.get("next")
            else selectors.annotator_progress(item.campaign, signed_in_user(request.user))
        )
        return Response(payload, status=201 if created else 200)


class ItemSkipView(_AnnotatorView):
    @extend_schema(
        summary="Skip an item for now (it comes back after my other items)",
        request=s.ClaimNextBodySerializer,
        responses={200: s.SkipResponseSerializer, 404: ERRORS_RESPONSE, 409: ERRORS_RESPONSE},
    )
    def post(self, request: Request, pk: int) -> Response:
        item = self._item(request, pk)
        body = s.ClaimNextBodySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.item_skip(item, signed_in_user(request.user))
        payload: dict[str, Any] = {
            "skipped": True,
            "progress": selectors.annotator_progress(item.campaign, signed_in_user(request.user)),
        }
        if body.validated_data["claim_next"]:
            payload["next"] = _next_payload(item.campaign, request)
        return Response(payload)


class ItemReleaseView(_AnnotatorView):
    @extend_schema(
        summary="Give an item back unjudged (idempotent)",
        request=None,
        responses={200: s.ReleaseResponseSerializer, 404: ERRORS_RESPONSE},
    )
    def post(self, request: Request, pk: int) -> Response:
        return Response({"released": services.item_release(self._item(request, pk), signed_in_user(request.user))})


# --- reviewers ------------------------------------------------------------------------------------


def _queue_entry(campaign: Campaign, user) -> dict[str, Any]:
    return next(entry for entry in selectors.reviewer_queue(user) if entry["id"] == campaign.pk)


def _next_review(campaign: Campaign, request: Request) -> dict[str, Any] | None:
    user = signed_in_user(request.user)
    item = services.item_claim_for_review(campaign, user)
    if item is None:
        return None
    return {
        "campaign": selectors.campaign_for_annotator(campaign),
        "item": selectors.item_for_reviewer(item, user),
        "queue": _queue_entry(campaign, user),
    }


class _ReviewerView(APIView):
    permission_classes = [IsReviewer]

    def _item(self, request: Request, pk: int) -> ReviewItem:
        return get_object_or_404(selectors.reviewer_items(signed_in_user(request.user)), pk=pk)


class AdjudicationQueueView(_ReviewerView):
    @extend_schema(
        summary="My campaigns to adjudicate (active or closed), with what is left",
        responses=s.ReviewerQueueEntrySerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        return Response(selectors.reviewer_queue(signed_in_user(request.user)))


class CampaignAdjudicateNextView(_ReviewerView):
    @extend_schema(
        summary="Claim my next item to adjudicate (its annotators disagree)",
        description="Every judgement of the item comes with it, responses in stored order (A = rollout_a). 204 "
        "when nothing is left for me now.",
        request=None,
        responses={
            200: s.NextReviewSerializer,
            204: OpenApiResponse(description="Nothing left for me now."),
            404: ERRORS_RESPONSE,
            409: ERRORS_RESPONSE,
        },
    )
    def post(self, request: Request, pk: int) -> Response:
        campaign = get_object_or_404(selectors.reviewer_campaigns(signed_in_user(request.user)), pk=pk)
        payload = _next_review(campaign, request)
        return Response(status=204) if payload is None else Response(payload)


class ItemDecisionView(_ReviewerView):
    @extend_schema(
        summary="Decide an item: my answers become its label (recorded with my name)",
        request=s.DecisionBodySerializer,
        responses={200: s.DecisionResponseSerializer, 400: ERRORS_RESPONSE, 404: ERRORS_RESPONSE, 409: ERRORS_RESPONSE},
    )
    def post(self, request: Request, pk: int) -> Response:
        item = self._item(request, pk)
        body = s.DecisionBodySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        user = signed_in_user(request.user)
        decided = services.decision_submit(item, user, body.validated_data["answers"])
        payload: dict[str, Any] = {
            "item": decided.pk,
            "decision": decided.decision,
            "decided_by": user.get_username(),
            "queue": _queue_entry(item.campaign, user),
        }
        if body.validated_data["claim_next"]:
            payload["next"] = _next_review(item.campaign, request)
        return Response(payload)


class ItemReviewReleaseView(_ReviewerView):
    @extend_schema(
        summary="Give an item back undecided (idempotent)",
        request=None,
        responses={200: s.ReleaseResponseSerializer, 404: ERRORS_RESPONSE},
    )
    def post(self, request: Request, pk: int) -> Response:
        item = self._item(request, pk)
        return Response({"released": services.item_review_release(item, signed_in_user(request.user))})
