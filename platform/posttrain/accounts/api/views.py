from django.contrib.auth.models import User
from drf_spectacular.utils import OpenApiExample, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.decorators import api_view
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from posttrain.accounts.selectors import user_role
from posttrain.accounts.services import token_get_or_create

_Token = inline_serializer("AuthTokenResponse", fields={"token": serializers.CharField()})
_Me = inline_serializer(
    "CurrentUser",
    fields={
        "id": serializers.IntegerField(),
        "username": serializers.CharField(),
        "role": serializers.CharField(allow_null=True),
    },
)


class ObtainTokenView(APIView):
    """Token for scripts: send it as `Authorization: Token <key>` on every request."""

    # No session/token authentication here: a logged-in browser would otherwise need a CSRF
    # token to ask for its own API token.
    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(
        summary="Get your API token for a username and password",
        description=(
            "Returns the user's API token (created on first request; the same key afterwards). "
            "Use it as `Authorization: Token <key>`. Wrong credentials give 400."
        ),
        request=AuthTokenSerializer,
        responses={200: _Token},
        examples=[
            OpenApiExample("Response", value={"token": "9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"}, response_only=True)
        ],
        tags=["auth"],
    )
    def post(self, request: Request) -> Response:
        serializer = AuthTokenSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        user: User = serializer.validated_data["user"]
        return Response({"token": token_get_or_create(user).key})


@extend_schema(summary="The signed-in user and their role", responses={200: _Me}, tags=["auth"])
@api_view(["GET"])
def me(request: Request) -> Response:
    user = request.user
    return Response({"id": user.pk, "username": user.get_username(), "role": user_role(user)})
