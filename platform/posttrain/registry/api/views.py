"""Registry API: thin viewsets over the registry services and selectors."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from posttrain.accounts.permissions import IsResearcher
from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.core.api.parsers import JSONParser
from posttrain.core.errors import WorkerUnavailable
from posttrain.registry import selectors, services
from posttrain.registry.api import serializers as s
from posttrain.registry.filters import DatasetFilter, ModelAssetFilter, RewardFunctionFilter
from posttrain.registry.models import RewardTrial


def _valid(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


_ERRORS = {400: ERRORS_RESPONSE}
_IN_USE = OpenApiResponse(ERRORS_RESPONSE, description="An experiment uses it: delete the experiments first.")
_WORKER_UNAVAILABLE = OpenApiResponse(
    ERRORS_RESPONSE,
    description="No worker ran the user code in time, or the worker has no sandbox for it (the message says what "
    "to install).",
)


def _trial_response(trial: RewardTrial) -> Response:
    if trial.state == RewardTrial.State.DONE:
        return Response({**(trial.result or {}), "trial": str(trial.id)})
    if trial.state == RewardTrial.State.FAILED:
        raise WorkerUnavailable(trial.error)
    return Response(s.RewardTrialSerializer(trial).data, status=status.HTTP_202_ACCEPTED)


class _RegistryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """List, retrieve, create (in each subclass), rename/redescribe (PATCH) and delete."""

    permission_classes = [IsResearcher]
    what = ""

    def _update(self, request: Request, update: Any) -> Response:
        obj = self.get_object()
        data = _valid(s.AssetUpdateSerializer, request.data)
        obj = update(obj, **data)
        return Response(self.get_serializer(obj).data)

    def _destroy(self, delete: Any) -> Response:
        obj = self.get_object()
        delete(obj)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- models -----------------------------------------------------------------------------------


@extend_schema_view(
    list=extend_schema(summary="List models", tags=["models"]),
    retrieve=extend_schema(summary="A model", tags=["models"]),
)
class ModelAssetViewSet(_RegistryViewSet):
    serializer_class = s.ModelAssetSerializer
    filterset_class = ModelAssetFilter

    def get_queryset(self):
        return selectors.model_list()

    @extend_schema(
        summary="Register a local Hugging Face model folder",
        description="Reads the architecture and the parameter count (from the safetensors headers) from the folder.",
        request=s.ModelRegisterSerializer,
        responses={201: s.ModelAssetSerializer, **_ERRORS},
        tags=["models"],
    )
    def create(self, request: Request) -> Response:
        data = _valid(s.ModelRegisterSerializer, request.data)
        model = services.model_register(data["name"], data["path"], description=data["description"], user=request.user)
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


# --- datasets ---------------------------------------------------------------------------------


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

    def get_queryset(self):
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
        if not hasattr(request.data, "keys"):
            raise serializers.ValidationError({"non_field_errors": ["the body must be a JSON object or a form"]})
        if "file" in request.FILES and "path" in request.data:
            raise serializers.ValidationError(
                {"path": ["give either an uploaded file or a server-side path, not both"]}
            )
        if "file" in request.FILES or "path" not in request.data:
            data = _valid(s.DatasetUploadSerializer, request.data)
            dataset, created = services.dataset_upload(
                data["name"],
                data["file"],
                data["format"],
                data["prompt_field"],
                data["label_field"],
                description=data["description"],
                user=request.user,
            )
        else:
            data = _valid(s.DatasetRegisterPathSerializer, request.data)
            dataset, created = services.dataset_register_path(
                data["name"],
                data["path"],
                data["format"],
                data["prompt_field"],
                data["label_field"],
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


# --- reward functions -------------------------------------------------------------------------


@extend_schema_view(
    list=extend_schema(summary="List reward functions", tags=["rewards"]),
    retrieve=extend_schema(summary="A reward function", tags=["rewards"]),
)
class RewardFunctionViewSet(_RegistryViewSet):
    serializer_class = s.RewardFunctionSerializer
    filterset_class = RewardFunctionFilter

    def get_queryset(self):
        return selectors.reward_list()

    @extend_schema(
        summary="Register a reward function",
        description=(
            "kind builtin (spec.type exact_match, boxed_math, regex or length_penalty), python (send the code as "
            "`source`; it is imported in the engine's sandbox to check it), http (spec.url of an OpenRLHF-style "
            "reward server) or reward_model (spec.path: a registered model's name or a model folder). The spec is "
            "validated by the engine's own schema; errors are keyed `spec.<field>`."
        ),
        request=s.RewardCreateSerializer,
        responses={201: s.RewardFunctionSerializer, **_ERRORS},
        examples=[
            OpenApiExample(
                "Regex",
                value={"name": "has-answer", "kind": "builtin", "spec": {"type": "regex", "pattern": "\\d+"}},
                request_only=True,
            ),
            OpenApiExample(
                "Python (verl shape)",
                value={
                    "name": "my-score",
                    "kind": "python",
                    "source": "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return float(solution_str.strip() == ground_truth)\n",
                },
                request_only=True,
            ),
        ],
        tags=["rewards"],
    )
    def create(self, request: Request) -> Response:
        data = _valid(s.RewardCreateSerializer, request.data)
        reward = services.reward_create(
            data["name"],
            data["kind"],
            data["spec"],
            data["source"],
            description=data["description"],
            user=request.user,
        )
        return Response(self.get_serializer(reward).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Rename or redescribe a reward function",
        request=s.AssetUpdateSerializer,
        responses={200: s.RewardFunctionSerializer, **_ERRORS},
        tags=["rewards"],
    )
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        return self._update(request, services.reward_update)

    @extend_schema(summary="Delete a reward function", responses={204: None, 409: _IN_USE}, tags=["rewards"])
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        return self._destroy(services.reward_delete)

    @extend_schema(
        summary="Try it: score sample inputs",
        description=(
            "Scores up to 32 samples through the engine's reward code exactly as a run would, on a Celery worker "
            "(never in the web server): python rewards in the sandbox, reward models in a separate process. A "
            "failing sample scores 0 and its reason is in `errors`. The request waits for the worker up to "
            "REWARD_TRY_WAIT_S (60 s): 200 with the scores, else 202 with the trial to poll at its `url`; 503 when "
            "the worker cannot run user code (no sandbox there)."
        ),
        request=s.RewardTrySerializer,
        responses={
            200: s.RewardTryResultSerializer,
            202: s.RewardTrialSerializer,
            503: _WORKER_UNAVAILABLE,
            **_ERRORS,
        },
        examples=[
            OpenApiExample(
                "Samples",
                value={"samples": [{"prompt": "2+2=", "response": "4", "label": "4"}]},
                request_only=True,
            )
        ],
        tags=["rewards"],
    )
    @action(detail=True, methods=["post"], url_path="try", url_name="try")
    def try_(self, request: Request, pk: str | None = None) -> Response:
        reward = self.get_object()
        data = _valid(s.RewardTrySerializer, request.data)
        trial = services.reward_try(reward, [dict(sample) for sample in data["samples"]], user=request.user)
        return _trial_response(trial)

    @extend_schema(
        summary="A Try it's outcome",
        description="A try that outlived its request: poll until `state` is done (then `result`) or failed.",
        responses={200: s.RewardTrialSerializer},
        tags=["rewards"],
    )
    @action(detail=True, methods=["get"], url_path=r"trials/(?P<trial_id>[0-9a-fA-F-]{36})", url_name="trial")
    def trial(self, request: Request, pk: str | None = None, trial_id: str | None = None) -> Response:
        reward = self.get_object()
        trial = get_object_or_404(selectors.reward_trials(reward), pk=trial_id)
        return Response(s.RewardTrialSerializer(trial).data)
