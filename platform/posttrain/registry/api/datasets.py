"""`/api/datasets/`: dataset uploads and server-side files, their preview and copies into other projects."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from posttrain.core.api.parsers import JSONParser
from posttrain.projects.permissions import target_project
from posttrain.registry import selectors, services
from posttrain.registry.api import serializers as s
from posttrain.registry.api.common import _ERRORS, _IN_USE, _is_upload, _RegistryViewSet, _valid
from posttrain.registry.filters import DatasetFilter


class _FormatIsAFilter:
    """DRF reads `?format=` as the response format; on datasets it is the file-format filter."""

    URL_FORMAT_OVERRIDE = None

    def __getattr__(self, name: str) -> Any:
        return getattr(api_settings, name)


class DatasetContentNegotiation(DefaultContentNegotiation):
    settings = _FormatIsAFilter()  # type: ignore[assignment]  # a stand-in that reads api_settings


@extend_schema_view(
    list=extend_schema(summary="List datasets", tags=["datasets"]),
    retrieve=extend_schema(summary="A dataset", tags=["datasets"]),
)
class DatasetViewSet(_RegistryViewSet):
    serializer_class = s.DatasetSerializer
    filterset_class = DatasetFilter
    parser_classes = [MultiPartParser, FormParser, JSONParser]
    content_negotiation_class = DatasetContentNegotiation

    def base_queryset(self):
        return selectors.dataset_list()

    @extend_schema(
        summary="Upload a dataset file, or register a file on the server",
        description=(
            "Multipart with `file` uploads it; JSON with `path` copies a server-side file. Both are validated "
            "(UTF-8, one JSON object per line, CSV header, readable Parquet, prompt and label fields in every row, "
            "size limit) and stored by content hash. The same content again returns the existing dataset with 200 "
            "instead of 201."
        ),
        request={
            "multipart/form-data": s.DatasetUploadSerializer,
            "application/json": s.DatasetRegisterPathSerializer,
        },
        responses={
            201: s.DatasetSerializer,
            200: OpenApiResponse(
                s.DatasetSerializer, description="The same content was stored before: the existing dataset."
            ),
            **_ERRORS,
        },
        examples=[
            OpenApiExample(
                "A bad line",
                value={
                    "errors": [{"loc": "file", "msg": "line 7: not valid JSON (Expecting ',' delimiter at column 12)"}]
                },
                response_only=True,
                status_codes=["400"],
            )
        ],
        tags=["datasets"],
    )
    def create(self, request: Request) -> Response:
        uploaded = _is_upload(request)
        project = target_project(request)
        if uploaded:
            data = _valid(s.DatasetUploadSerializer, request)
            dataset, created = services.dataset_upload(
                data["name"],
                data["file"],
                data["format"],
                data["prompt_field"],
                data["label_field"],
                project=project,
                description=data["description"],
                user=request.user,
            )
        else:
            data = _valid(s.DatasetRegisterPathSerializer, request)
            dataset, created = services.dataset_register_path(
                data["name"],
                data["path"],
                data["format"],
                data["prompt_field"],
                data["label_field"],
                project=project,
                description=data["description"],
                user=request.user,
            )
        return Response(
            self.get_serializer(dataset).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )

    @extend_schema(
        summary="Rename or redescribe a dataset",
        request=s.AssetUpdateSerializer,
        responses={200: s.DatasetSerializer, **_ERRORS},
        tags=["datasets"],
    )
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        return self._update(request, services.dataset_update)

    @extend_schema(
        summary="Delete a dataset and its stored file", responses={204: None, 409: _IN_USE}, tags=["datasets"]
    )
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        return self._destroy(services.dataset_delete)

    @extend_schema(
        summary="The first rows of a dataset", responses={200: s.DatasetPreviewSerializer}, tags=["datasets"]
    )
    @action(detail=True, methods=["get"])
    def preview(self, request: Request, pk: str | None = None) -> Response:
        # The list queryset defers the preview; one extra query here is the point of that.
        return Response(selectors.dataset_preview(self.get_object()))

    @extend_schema(
        summary="The dataset in another project too (the same stored file; that project's own entry if it has "
        "the same content: 200)",
        request=s.AssetCopySerializer,
        responses={201: s.DatasetSerializer, 200: s.DatasetSerializer, **_ERRORS},
        tags=["datasets"],
    )
    @action(detail=True, methods=["post"])
    def copy(self, request: Request, pk: str | None = None) -> Response:
        return self._copy(request, services.dataset_copy)
