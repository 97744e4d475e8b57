"""`/api/review/annotators/` and `/api/review/reviewers/`: the users a researcher may assign to a campaign, by
role."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from posttrain.accounts.permissions import IsResearcher
from posttrain.accounts.roles import Role
from posttrain.review.api import serializers as s


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
