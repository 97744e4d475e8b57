"""`/api/projects/`: projects, their members, and the project a browser session works in."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from posttrain.accounts.permissions import IsResearcher
from posttrain.accounts.selectors import signed_in_user
from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.core.errors import PermissionDenied
from posttrain.projects import access, services
from posttrain.projects.api import serializers as s
from posttrain.projects.models import Project
from posttrain.projects.permissions import SESSION_KEY, session_project
from posttrain.projects.selectors import project_list, project_members, project_named

_ERRORS = {400: ERRORS_RESPONSE, 403: ERRORS_RESPONSE, 404: ERRORS_RESPONSE}


def _valid(serializer_class: type[serializers.Serializer], data: object) -> dict:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class ProjectViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Every signed-in researcher may make a project (and owns it); its owners and maintainers manage it."""

    permission_classes = [IsResearcher]
    serializer_class = s.ProjectSerializer
    pagination_class = None

    def get_queryset(self):
        return project_list(self.request.user).select_related("created_by")

    def _managed(self) -> Project:
        return access.require_manage(self.request.user, self.get_object())

    @extend_schema(
        summary="Make a project (you are its owner)",
        request=s.ProjectCreateSerializer,
        responses={201: s.ProjectSerializer, **_ERRORS},
        tags=["projects"],
    )
    def create(self, request: Request) -> Response:
        data = _valid(s.ProjectCreateSerializer, request.data)
        project = services.project_create(
            data["name"], description=data["description"], user=signed_in_user(request.user)
        )
        return Response(self.get_serializer(project_list(request.user).get(pk=project.pk)).data, status=201)

    @extend_schema(
        summary="Redescribe a project (its owners and maintainers)",
        request=s.ProjectUpdateSerializer,
        responses={200: s.ProjectSerializer, **_ERRORS},
        tags=["projects"],
    )
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        project = self._managed()
        data = _valid(s.ProjectUpdateSerializer, request.data)
        project = services.project_update(project, description=data["description"])
        return Response(self.get_serializer(project).data)

    @extend_schema(
        summary="Delete an empty project (its owners)",
        responses={204: None, 409: ERRORS_RESPONSE, **_ERRORS},
        tags=["projects"],
    )
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        project = self._managed()
        if not access.is_admin(request.user) and access.role_in(request.user, project.pk) != "owner":
            raise PermissionDenied("only an owner of the project deletes it")
        services.project_delete(project)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        summary="A project's members and their roles",
        responses={200: s.MembershipSerializer(many=True)},
        tags=["projects"],
    )
    @action(detail=True, methods=["get"])
    def members(self, request: Request, pk: str | None = None) -> Response:
        return Response(s.MembershipSerializer(project_members(self.get_object()), many=True).data)

    @extend_schema(
        methods=["PUT"],
        summary="Add a user to the project or change their role (its owners and maintainers)",
        description="Only an owner makes or unmakes an owner; the last owner stays one.",
        request=s.MembershipSetSerializer,
        responses={200: s.MembershipSerializer, 409: ERRORS_RESPONSE, **_ERRORS},
        tags=["projects"],
    )
    @extend_schema(
        methods=["DELETE"],
        summary="Take a user out of the project (its owners and maintainers; anyone may leave)",
        responses={204: None, 409: ERRORS_RESPONSE, **_ERRORS},
        tags=["projects"],
    )
    @action(detail=True, methods=["put", "delete"], url_path=r"members/(?P<username>[\w.@+-]{1,150})")
    def member(self, request: Request, pk: str | None = None, username: str | None = None) -> Response:
        if request.method == "DELETE":
            project = self.get_object()
            if username != request.user.get_username():
                access.require_manage(request.user, project)
            services.membership_remove(project, username, actor=request.user)
            return Response(status=status.HTTP_204_NO_CONTENT)
        project = self._managed()
        data = _valid(s.MembershipSetSerializer, request.data)
        membership = services.membership_set(project, username, data["role"], actor=request.user)
        return Response(s.MembershipSerializer(membership).data)


_Current = inline_serializer(
    "CurrentProject",
    fields={
        "project": s.ProjectSerializer(allow_null=True),
        "admin": serializers.BooleanField(help_text="You read every project (the admin role)."),
    },
)


class CurrentProjectView(APIView):
    """The project a browser session lists and creates in (the page's switcher). Token clients name theirs."""

    permission_classes = [IsResearcher]

    @extend_schema(summary="The project this session works in", responses={200: _Current}, tags=["projects"])
    def get(self, request: Request) -> Response:
        return Response(s.current_payload(session_project(request), request))

    @extend_schema(
        summary="Choose the project this session works in (null: every project, for lists)",
        request=s.CurrentProjectSerializer,
        responses={200: _Current, **_ERRORS},
        tags=["projects"],
    )
    def put(self, request: Request) -> Response:
        data = _valid(s.CurrentProjectSerializer, request.data)
        project = None if data["project"] in (None, "") else project_named(data["project"], request.user)
        # project_named finds only projects the user reads: one they do not is answered as missing.
        if project is None:
            request.session.pop(SESSION_KEY, None)
        else:
            request.session[SESSION_KEY] = project.pk
        return Response(s.current_payload(project, request))
