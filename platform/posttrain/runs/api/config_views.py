"""The run config for the browser's launch form: the engine's JSON schema, live validation of an
experiment exactly as its create would do it, and YAML in and out.

The schema, the validation and the YAML parser are the engine's own (rl_engine.config), so the form
can never accept what a run would refuse, and YAML errors name the line the engine would name.
"""

from __future__ import annotations

import math
from typing import Any

import yaml
from drf_spectacular.utils import OpenApiExample, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from posttrain.accounts.permissions import IsResearcher
from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.core.errors import InvalidInput
from posttrain.projects.permissions import target_project
from posttrain.runs import services
from posttrain.runs.api.serializers import ExperimentCreateSerializer

MAX_YAML_CHARS = 200_000
# Far more values than any run config has; YAML aliases can expand a few lines into billions.
MAX_YAML_VALUES = 20_000


def config_to_yaml(config: dict[str, Any]) -> str:
    """An (experiment) config as YAML, keys in the order given, as the engine's dump_config writes it."""
    return yaml.safe_dump(config, sort_keys=False, allow_unicode=True, default_flow_style=False)


def config_from_yaml(text: str) -> dict[str, Any]:
    """The mapping in YAML (or JSON) text, parsed by the engine's strict loader (duplicate keys are
    errors; syntax errors name the line). Not validated: a form config lacks the platform's fields."""
    # The engine's parser is private to rl_engine.config; reusing it keeps its messages identical.
    from rl_engine.spec.config import ConfigError, parse_text

    try:
        data = parse_text(text)
    except ConfigError as exc:
        raise InvalidInput([{"loc": "yaml", "msg": e["msg"]} for e in exc.errors]) from None
    except RecursionError:
        raise InvalidInput.one("yaml", "the YAML is nested too deeply") from None
    if not isinstance(data, dict):
        raise InvalidInput.one("yaml", f"a run config must be a mapping of sections, got {_yaml_type(data)}")
    return _plain_json(data)


def _yaml_type(value: Any) -> str:
    return "a list" if isinstance(value, list) else f"a single value ({str(value)[:50]!r})"


def _plain_json(data: dict[str, Any]) -> dict[str, Any]:
    """YAML can hold what a JSON response cannot (NaN, dates, non-string keys) and aliases that
    expand exponentially; the form gets plain JSON of a sane size or a 400."""
    count = 0

    def walk(value: Any, loc: str) -> Any:
        nonlocal count
        count += 1
        if count > MAX_YAML_VALUES:
            raise InvalidInput.one("yaml", f"more than {MAX_YAML_VALUES} values: is an alias expanding without end?")
        if isinstance(value, dict):
            return {str(k): walk(v, f"{loc}.{k}" if loc else str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v, f"{loc}.{i}") for i, v in enumerate(value)]
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidInput.one("yaml", f"{loc}: {value} is not allowed in a run config; give a finite number")
        if value is None or isinstance(value, (str, int, float, bool)):
            return value
        return str(value)  # a date or a timestamp: the engine's validation then names the field

    return walk(data, "")


class ConfigSchemaView(APIView):
    permission_classes = [IsResearcher]

    @extend_schema(
        summary="The run-config JSON schema (the launch form is generated from it)",
        description="`schema` is rl_engine.config's JSON schema (sections, defaults, limits, help text); "
        "`platform_fields` are the dotted fields the platform fills from the registry and the run, which an "
        "experiment's config must leave out.",
        responses={
            200: inline_serializer(
                "ConfigSchema",
                fields={
                    "schema": serializers.DictField(),
                    "platform_fields": serializers.ListField(child=serializers.CharField()),
                },
            )
        },
    )
    def get(self, request: Request) -> Response:
        from rl_engine.spec.config import config_json_schema

        return Response({"schema": config_json_schema(), "platform_fields": list(services.PLATFORM_FIELDS)})


class ExperimentValidateView(APIView):
    permission_classes = [IsResearcher]

    @extend_schema(
        summary="Validate an experiment without creating it",
        description="The same body and the same checks as creating an experiment, and nothing is written. "
        "`config` is the full engine config a run would get (defaults filled in; `logging.run_dir` and the seed "
        "are set at launch); `yaml` is the experiment's own config (without the platform's fields) as YAML.",
        request=ExperimentCreateSerializer,
        responses={
            200: inline_serializer(
                "ExperimentValidation",
                fields={
                    "config": serializers.DictField(),
                    "yaml": serializers.CharField(),
                    "resources": serializers.DictField(
                        help_text='What a run of it holds on the cluster: {"driver": {"CPU", "GPU"}, "bundles": '
                        '[{"CPU", "GPU"}], "total": {"CPU", "GPU"}} (the engine\'s placement plan).'
                    ),
                },
            ),
            400: ERRORS_RESPONSE,
        },
    )
    def post(self, request: Request) -> Response:
        project = target_project(request)
        body = ExperimentCreateSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        checked = services.experiment_check(
            project=project,
            name=data["name"],
            model=data["model"],
            dataset=data["dataset"],
            rewards=[(item["reward"], item["weight"]) for item in data["rewards"]],
            config=data["config"],
            user=request.user,
            webhook_url=data["webhook_url"],
        )
        return Response(
            {"config": checked.engine_config, "yaml": config_to_yaml(data["config"]), "resources": checked.resources}
        )


class ConfigTextSerializer(serializers.Serializer):
    yaml = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=MAX_YAML_CHARS,
        help_text="YAML (or JSON) text of a config: answered with `config`.",
    )
    config = serializers.JSONField(required=False, help_text="A config object: answered with `yaml`.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("yaml" in attrs) == ("config" in attrs):
            raise serializers.ValidationError("send either `yaml` (text to parse) or `config` (an object to dump)")
        if "config" in attrs and not isinstance(attrs["config"], dict):
            raise serializers.ValidationError({"config": f"must be an object, got {type(attrs['config']).__name__}"})
        return attrs


class ConfigYamlView(APIView):
    permission_classes = [IsResearcher]

    @extend_schema(
        summary="Convert a config between YAML and JSON",
        description='`{"yaml": text}` → `{"config": object}` (parsed only: validate it with the experiment); '
        'a YAML error is a 400 with loc `yaml` and the line. `{"config": object}` → `{"yaml": text}`.',
        request=ConfigTextSerializer,
        responses={
            200: inline_serializer(
                "ConfigConversion",
                fields={"config": serializers.DictField(required=False), "yaml": serializers.CharField(required=False)},
            ),
            400: ERRORS_RESPONSE,
        },
        examples=[
            OpenApiExample("Parse", value={"yaml": "rollout:\n  samples_per_prompt: 4\n"}, request_only=True),
            OpenApiExample(
                "A syntax error",
                response_only=True,
                status_codes=["400"],
                value={
                    "errors": [
                        {
                            "loc": "yaml",
                            "msg": "YAML syntax error at line 2, column 3: mapping values are not allowed here",
                        }
                    ]
                },
            ),
        ],
    )
    def post(self, request: Request) -> Response:
        body = ConfigTextSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if "yaml" in body.validated_data:
            return Response({"config": config_from_yaml(body.validated_data["yaml"])})
        return Response({"yaml": config_to_yaml(body.validated_data["config"])})
