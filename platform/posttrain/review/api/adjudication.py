"""Reviewers adjudicate: their campaigns with what is left, claiming the next disputed item, deciding it and
releasing it."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from posttrain.accounts.permissions import IsReviewer
from posttrain.accounts.selectors import signed_in_user
from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.review import selectors, services
from posttrain.review.api import serializers as s
from posttrain.review.models import Campaign, ReviewItem


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
