"""`/api/rewards/`: reward functions, their Try it trials and their hackability probes."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from posttrain.core.errors import InvalidInput, WorkerUnavailable
from posttrain.projects.access import Access, readable
from posttrain.projects.permissions import require_same_project, target_project
from posttrain.registry import selectors, services
from posttrain.registry.api import serializers as s
from posttrain.registry.api.common import _ERRORS, _IN_USE, _WORKER_UNAVAILABLE, _RegistryViewSet, _valid
from posttrain.registry.filters import RewardFunctionFilter
from posttrain.registry.models import Dataset, RewardTrial


def _trial_response(trial: RewardTrial) -> Response:
    if trial.state == RewardTrial.State.DONE:
        return Response({**(trial.result or {}), "trial": str(trial.id)})
    if trial.state == RewardTrial.State.FAILED:
        raise WorkerUnavailable(trial.error)
    return Response(s.RewardTrialSerializer(trial).data, status=status.HTTP_202_ACCEPTED)


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


def _int_param(request: Request, name: str) -> int:
    try:
        return int(request.query_params[name])
    except ValueError:
        raise InvalidInput.one(name, "must be an integer") from None
