"""`/api/models/`: registered models, their copies into other projects and GGUF imports."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from posttrain.core.api.parsers import JSONParser
from posttrain.projects.access import Access
from posttrain.projects.permissions import object_for, target_project
from posttrain.registry import selectors, services
from posttrain.registry.api import serializers as s
from posttrain.registry.api.common import _ERRORS, _IN_USE, _is_upload, _RegistryViewSet, _valid
from posttrain.registry.filters import ModelAssetFilter
from posttrain.registry.gguf_uploads import GGUFUploadHandler


@extend_schema_view(
    list=extend_schema(summary="List models", tags=["models"]),
    retrieve=extend_schema(summary="A model", tags=["models"]),
)
class ModelAssetViewSet(_RegistryViewSet):
    serializer_class = s.ModelAssetSerializer
    filterset_class = ModelAssetFilter

    def base_queryset(self):
        return selectors.model_list()

    def initialize_request(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Request:
        drf_request = super().initialize_request(request, *args, **kwargs)
        if self.action == "import_gguf":
            # Before anything reads the body (the CSRF check reads the form): the file goes straight into its
            # staging folder, hashed on the way, instead of into a temporary file to be copied from.
            request.upload_handlers = [GGUFUploadHandler(request)]
        return drf_request

    @extend_schema(
        summary="Register a local Hugging Face model folder",
        description="Reads the architecture and the parameter count (from the safetensors headers) from the folder.",
        request=s.ModelRegisterSerializer,
        responses={201: s.ModelAssetSerializer, **_ERRORS},
        tags=["models"],
    )
    def create(self, request: Request) -> Response:
        project = target_project(request)
        data = _valid(s.ModelRegisterSerializer, request)
        model = services.model_register(
            data["name"],
            data["path"],
            project=project,
            description=data["description"],
            user=request.user,
        )
        return Response(self.get_serializer(model).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Rename or redescribe a model",
        request=s.AssetUpdateSerializer,
        responses={200: s.ModelAssetSerializer, **_ERRORS},
        tags=["models"],
    )
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        return self._update(request, services.model_update)

    @extend_schema(summary="Delete a model (its folder stays)", responses={204: None, 409: _IN_USE}, tags=["models"])
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        return self._destroy(services.model_delete)

    @extend_schema(
        summary="Register the model in another project too (the same folder, lineage kept)",
        request=s.AssetCopySerializer,
        responses={201: s.ModelAssetSerializer, **_ERRORS},
        tags=["models"],
    )
    @action(detail=True, methods=["post"])
    def copy(self, request: Request, pk: str | None = None) -> Response:
        return self._copy(request, services.model_copy)

    @extend_schema(
        summary="Import a GGUF model",
        description=(
            "Multipart with `file` uploads a GGUF (at most GGUF_IMPORT_MAX_BYTES); JSON with `path` names one on "
            "the server (a user an admin granted server paths). A file that does not start as a GGUF of version 2 "
            "or 3 is refused at once; the rest is the user-code worker's, in the engine's sandbox: the header read "
            "with bounded reads (truncated files, unsupported tensor types and architectures refused, each named), "
            "the weights dequantized into safetensors in the host's training dtype with the config, tokenizer, "
            "chat template and generation config, the result loaded and asked one prompt, then moved into the "
            "models store and registered with its provenance. Answers 202 with the import; follow it at its `url` "
            "until `state` is done (its `model`) or failed (its `error`)."
        ),
        request={
            "multipart/form-data": s.ModelImportUploadSerializer,
            "application/json": s.ModelImportPathSerializer,
        },
        responses={202: s.ModelImportSerializer, **_ERRORS},
        examples=[
            OpenApiExample(
                "Not a GGUF",
                value={
                    "errors": [
                        {
                            "loc": "file",
                            "msg": "not a GGUF file: it starts with 50 4b 03 04, not the magic bytes 47 47 55 46 "
                            "('GGUF')",
                        }
                    ]
                },
                response_only=True,
                status_codes=["400"],
            )
        ],
        tags=["models"],
    )
    @action(
        detail=False,
        methods=["post"],
        url_path="import-gguf",
        url_name="import-gguf",
        parser_classes=[MultiPartParser, JSONParser],
    )
    def import_gguf(self, request: Request) -> Response:
        uploaded = _is_upload(request)
        project = target_project(request)
        if uploaded:
            data = _valid(s.ModelImportUploadSerializer, request)
            record = services.model_import_upload(
                data["name"], data["file"], project=project, description=data["description"], user=request.user
            )
        else:
            data = _valid(s.ModelImportPathSerializer, request)
            record = services.model_import_path(
                data["name"], data["path"], project=project, description=data["description"], user=request.user
            )
        return Response(s.ModelImportSerializer(record).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        summary="A GGUF import",
        description="Poll until `state` is done (then `model`) or failed (then `error`).",
        responses={200: s.ModelImportSerializer},
        tags=["models"],
    )
    @action(detail=False, methods=["get"], url_path=r"imports/(?P<import_id>[0-9a-fA-F-]{36})", url_name="import")
    def import_(self, request: Request, import_id: str | None = None) -> Response:
        record = object_for(request, selectors.model_imports(), Access.READ, pk=import_id)
        return Response(s.ModelImportSerializer(record).data)
