"""Registry API: thin viewsets over the registry services and selectors."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
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
from posttrain.core.errors import InvalidInput, WorkerUnavailable
from posttrain.projects.access import Access, readable
from posttrain.projects.permissions import (
    ProjectAccess,
    ProjectScopedMixin,
    copy_target,
    object_for,
    require_same_project,
    target_project,
)
from posttrain.registry import selectors, services
from posttrain.registry.api import serializers as s
from posttrain.registry.filters import DatasetFilter, ModelAssetFilter, RewardFunctionFilter
from posttrain.registry.gguf_uploads import GGUFUploadHandler
from posttrain.registry.models import Dataset, Environment, EnvironmentTrial, RewardTrial


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


def _trial_response(trial: RewardTrial) -> Response:
    if trial.state == RewardTrial.State.DONE:
        return Response({**(trial.result or {}), "trial": str(trial.id)})
    if trial.state == RewardTrial.State.FAILED:
        raise WorkerUnavailable(trial.error)
    return Response(s.RewardTrialSerializer(trial).data, status=status.HTTP_202_ACCEPTED)


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


# --- models -----------------------------------------------------------------------------------


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


# --- reward functions -------------------------------------------------------------------------


@extend_schema_view(
    list=extend_schema(summary="List reward functions", tags=["rewards"]),
    retrieve=extend_schema(summary="A reward function", tags=["rewards"]),
)
class RewardFunctionViewSet(_RegistryViewSet):
    serializer_class = s.RewardFunctionSerializer
    filterset_class = RewardFunctionFilter

    project_access = {"copy": Access.READ, "try_": Access.CREATE, "probes": Access.CREATE}

    def base_queryset(self):
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
        project = target_project(request)
        data = _valid(s.RewardCreateSerializer, request)
        reward = services.reward_create(
            data["name"],
            data["kind"],
            data["spec"],
            data["source"],
            project=project,
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
        summary="The reward in another project too (the same spec and code)",
        request=s.AssetCopySerializer,
        responses={201: s.RewardFunctionSerializer, **_ERRORS},
        tags=["rewards"],
    )
    @action(detail=True, methods=["post"])
    def copy(self, request: Request, pk: str | None = None) -> Response:
        return self._copy(request, services.reward_copy)

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
        data = _valid(s.RewardTrySerializer, request)
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

    @extend_schema(
        methods=["GET"],
        summary="The reward's probes",
        description="Its probes on every dataset (`?dataset=<id>`: on one), the newest first.",
        responses={200: s.RewardProbeSerializer(many=True)},
        tags=["rewards"],
    )
    @extend_schema(
        methods=["POST"],
        summary="Probe a reward for hackability",
        description=(
            "Scores adversarial answers built from the dataset (empty, the prompt echoed, every label listed, the "
            "right label buried in noise, the right format with a wrong answer, very long, one word repeated, "
            "another row's label) against the honest answers (the labels), on the user-code worker like Try it. "
            "Answers 202 with the queued probe; follow it at its `url` until `state` is done (its `result` is the "
            "hackability report: a probe scoring 50% or more of the honest reward is flagged) or failed."
        ),
        request=s.RewardProbeStartSerializer,
        responses={202: s.RewardProbeSerializer, **_ERRORS},
        tags=["rewards"],
    )
    @action(detail=True, methods=["get", "post"], url_path="probes", url_name="probes")
    def probes(self, request: Request, pk: str | None = None) -> Response:
        reward = self.get_object()
        if request.method == "POST":
            data = _valid(s.RewardProbeStartSerializer, request)
            require_same_project("dataset", data["dataset"], reward.project)
            probe = services.reward_probe_start(reward, data["dataset"], user=request.user)
            return Response(s.RewardProbeSerializer(probe).data, status=status.HTTP_202_ACCEPTED)
        dataset = None
        if request.query_params.get("dataset"):
            dataset = get_object_or_404(
                readable(Dataset.objects.all(), request.user), pk=_int_param(request, "dataset")
            )
        probes = selectors.reward_probes(reward, dataset)[:50]
        return Response(s.RewardProbeSerializer(probes, many=True).data)

    @extend_schema(summary="A reward probe", responses={200: s.RewardProbeSerializer}, tags=["rewards"])
    @action(detail=True, methods=["get"], url_path=r"probes/(?P<probe_id>[0-9a-fA-F-]{36})", url_name="probe")
    def probe(self, request: Request, pk: str | None = None, probe_id: str | None = None) -> Response:
        reward = self.get_object()
        probe = get_object_or_404(selectors.reward_probes(reward), pk=probe_id)
        return Response(s.RewardProbeSerializer(probe).data)


# --- environments ----------------------------------------------------------------------------------


def _environment_trial_response(trial: EnvironmentTrial) -> Response:
    if trial.state == EnvironmentTrial.State.DONE:
        return Response({**(trial.result or {}), "trial": str(trial.id)})
    if trial.state == EnvironmentTrial.State.FAILED:
        raise WorkerUnavailable(trial.error)
    return Response(s.EnvironmentTrialSerializer(trial).data, status=status.HTTP_202_ACCEPTED)


def _environment_named(name_or_id: str, request: Request, project: Any) -> Environment:
    """An environment of the project the mix is made in, by name or id."""
    environments = readable(selectors.environment_list(), request.user).filter(project=project)
    found = environments.filter(name=name_or_id).first()
    if found is None and name_or_id.isdigit():
        found = environments.filter(pk=int(name_or_id)).first()
    if found is None:
        raise serializers.ValidationError(
            {"environments": [f"no environment named {name_or_id!r} in project {project.name!r}"]}
        )
    return found


@extend_schema_view(
    list=extend_schema(summary="List environments", tags=["environments"]),
    retrieve=extend_schema(summary="An environment", tags=["environments"]),
)
class EnvironmentViewSet(_RegistryViewSet):
    serializer_class = s.EnvironmentSerializer

    project_access = {"try_": Access.CREATE}

    def base_queryset(self):
        return selectors.environment_list()

    @extend_schema(
        summary="Register an installed environment",
        description=(
            "reasoning-gym, verifiers, TextArena or OpenEnv, by its id in the package and its arguments. A worker "
            "generates its rows in the engine's sandbox (201 answers with state generating; poll until ready, or "
            "failed with the package's own message) and registers them as a dataset, with the environment's own "
            "scoring as a reward (reasoning-gym, verifiers) or its engine environment section (TextArena, OpenEnv)."
        ),
        request=s.EnvironmentCreateSerializer,
        responses={201: s.EnvironmentSerializer, **_ERRORS},
        examples=[
            OpenApiExample(
                "reasoning-gym",
                value={"name": "spell", "package": "reasoning_gym", "env_id": "spell_backward", "size": 1000},
                request_only=True,
            ),
            OpenApiExample(
                "TextArena",
                value={"name": "guess", "package": "textarena", "env_id": "GuessTheNumber-v0", "size": 200},
                request_only=True,
            ),
        ],
        tags=["environments"],
    )
    def create(self, request: Request) -> Response:
        project = target_project(request)
        data = _valid(s.EnvironmentCreateSerializer, request)
        environment = services.environment_create(
            data["name"],
            data["package"],
            data["env_id"],
            data["arguments"],
            size=data["size"],
            seed=data["seed"],
            files=data["files"],
            project=project,
            description=data["description"],
            user=request.user,
        )
        return Response(self.get_serializer(environment).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Delete an environment (its dataset and reward stay)", responses={204: None}, tags=["environments"]
    )
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        return self._destroy(services.environment_delete)

    @extend_schema(
        summary="Try it: play one episode",
        description=(
            "Plays one episode from the dataset's row `row` with `moves` as the model's turns, on a Celery worker in "
            "the engine's sandbox, and answers it turn by turn (a single-turn environment scores the first move). "
            "Waits up to REWARD_TRY_WAIT_S: 200 with the episode, else 202 with the trial to poll at its `url`."
        ),
        request=s.EnvironmentTrySerializer,
        responses={
            200: OpenApiResponse(description="turns, reward, done, errors, logs"),
            202: s.EnvironmentTrialSerializer,
            503: _WORKER_UNAVAILABLE,
            **_ERRORS,
        },
        tags=["environments"],
    )
    @action(detail=True, methods=["post"], url_path="try", url_name="try")
    def try_(self, request: Request, pk: str | None = None) -> Response:
        environment = self.get_object()
        data = _valid(s.EnvironmentTrySerializer, request)
        trial = services.environment_try(environment, list(data["moves"]), data["row"], user=request.user)
        return _environment_trial_response(trial)

    @extend_schema(summary="A Try it's outcome", responses={200: s.EnvironmentTrialSerializer}, tags=["environments"])
    @action(detail=True, methods=["get"], url_path=r"trials/(?P<trial_id>[0-9a-fA-F-]{36})", url_name="trial")
    def trial(self, request: Request, pk: str | None = None, trial_id: str | None = None) -> Response:
        environment = self.get_object()
        trial = get_object_or_404(selectors.environment_trials(environment), pk=trial_id)
        return Response(s.EnvironmentTrialSerializer(trial).data)

    @extend_schema(
        summary="Mix environments into one dataset",
        description=(
            "A dataset whose rows come from single-turn environments chosen by weight (seeded); each row keeps its "
            "environment's name in `env`, so a run on it keeps a curve per environment (env/<name>/reward/mean). "
            "Use it with every part's reward (`rewards`)."
        ),
        request=s.EnvironmentMixSerializer,
        responses={201: s.EnvironmentMixResultSerializer, **_ERRORS},
        tags=["environments"],
    )
    @action(detail=False, methods=["post"], url_path="mix", url_name="mix")
    def mix(self, request: Request) -> Response:
        project = target_project(request)
        data = _valid(s.EnvironmentMixSerializer, request)
        parts = [
            (_environment_named(part["environment"], request, project), float(part["weight"]))
            for part in data["environments"]
        ]
        dataset = services.environments_mix(
            data["name"], parts, size=data["size"], seed=data["seed"], project=project, user=request.user
        )
        rewards = [env.reward.name for env, _ in parts if env.reward is not None]
        return Response(
            {"dataset": s.DatasetSerializer(dataset).data, "rewards": rewards}, status=status.HTTP_201_CREATED
        )


def _int_param(request: Request, name: str) -> int:
    try:
        return int(request.query_params[name])
    except ValueError:
        raise InvalidInput.one(name, "must be an integer") from None
