"""What the registry's viewsets share: the base viewset (update, delete, copy), request validation, the upload-or-path
choice and the shared error responses."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from posttrain.accounts.permissions import IsResearcher
from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.projects.access import Access
from posttrain.projects.permissions import ProjectAccess, ProjectScopedMixin, copy_target
from posttrain.registry.api import serializers as s


def _valid(serializer_class: type[serializers.Serializer], request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.data, context={"request": request})
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


_ERRORS = {400: ERRORS_RESPONSE}
_IN_USE = OpenApiResponse(ERRORS_RESPONSE, description="An experiment uses it: delete the experiments first.")
_WORKER_UNAVAILABLE = OpenApiResponse(
    ERRORS_RESPONSE,
    description="No worker ran the user code in time, or the worker has no sandbox for it (the message says what "
    "to install).",
)


def _is_upload(request: Request) -> bool:
    """Whether a create that takes a file names it by upload (multipart `file`) or by server path (`path`);
    without either, an upload whose file is missing (the error names `file`)."""
    if not hasattr(request.data, "keys"):
        raise serializers.ValidationError({"non_field_errors": ["the body must be a JSON object or a form"]})
    if "file" in request.FILES and "path" in request.data:
        raise serializers.ValidationError({"path": ["give either an uploaded file or a server-side path, not both"]})
    return "file" in request.FILES or "path" not in request.data


class _RegistryViewSet(ProjectScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """List, retrieve, create (in each subclass, in the request's project), rename/redescribe (PATCH), delete,
    and copy into another project (reads the source, creates in the target)."""

    permission_classes = [IsResearcher, ProjectAccess]
    project_access = {"copy": Access.READ}

    def _update(self, request: Request, update: Any) -> Response:
        obj = self.get_object()
        data = _valid(s.AssetUpdateSerializer, request)
        obj = update(obj, **data)
        return Response(self.get_serializer(obj).data)

    def _destroy(self, delete: Any) -> Response:
        obj = self.get_object()
        delete(obj)
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _copy(self, request: Request, copy: Any) -> Response:
        source = self.get_object()
        target = copy_target(request, source)
        data = _valid(s.AssetCopySerializer, request)
        made = copy(source, target, name=data.get("name") or None, user=request.user)
        obj, created = made if isinstance(made, tuple) else (made, True)
        return Response(
            self.get_serializer(obj).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )
