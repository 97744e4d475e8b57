"""Annotators work their queue: their campaigns, claiming the next item, judging, skipping and releasing items."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from posttrain.accounts.permissions import IsAnnotator
from posttrain.accounts.selectors import signed_in_user
from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.review import selectors, services
from posttrain.review.api import serializers as s
from posttrain.review.models import Campaign, ReviewItem
from posttrain.review.questions import swap_pairwise


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
