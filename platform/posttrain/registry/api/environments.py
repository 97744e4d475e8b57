"""`/api/environments/`: installed environments, their Try it episodes and their mixes into one dataset."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from posttrain.core.errors import WorkerUnavailable
from posttrain.projects.access import Access, readable
from posttrain.projects.permissions import target_project
from posttrain.registry import selectors, services
from posttrain.registry.api import serializers as s
from posttrain.registry.api.common import _ERRORS, _WORKER_UNAVAILABLE, _RegistryViewSet, _valid
from posttrain.registry.models import Environment, EnvironmentTrial


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
