"""Error responses of the runs API: every bad input is a 4xx whose errors name the field.

Validation errors (ours and DRF's) take one shape, `{"errors": [{"loc": "rewards[0].weight", "msg": …}]}`;
conflicts carry what the client needs to recover (`state`, `expected_seq`).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import exception_handler

from posttrain.runs.errors import RunsError


def flatten_errors(detail: Any, prefix: str = "") -> list[dict[str, str]]:
    """DRF's nested error detail as `{"loc", "msg"}` items (`rewards[1].weight`)."""
    if isinstance(detail, dict):
        out = []
        for key, value in detail.items():
            if key in ("non_field_errors", "detail"):
                out += flatten_errors(value, prefix)
            elif isinstance(key, int):  # ListField child errors are keyed by index
                out += flatten_errors(value, f"{prefix}[{key}]")
            else:
                out += flatten_errors(value, f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(detail, list):
        if all(isinstance(item, str) for item in detail):
            return [{"loc": prefix, "msg": str(item)} for item in detail]
        out = []
        for i, item in enumerate(detail):
            if isinstance(item, str):
                out.append({"loc": prefix, "msg": str(item)})
            elif item:  # ListSerializer: {} for the valid children
                out += flatten_errors(item, f"{prefix}[{i}]")
        return out
    return [{"loc": prefix, "msg": str(detail)}]


def runs_exception_handler(exc: Exception, context: dict) -> Response | None:
    if isinstance(exc, RunsError):
        return Response(exc.payload(), status=exc.status_code)
    if isinstance(exc, exceptions.ValidationError):
        return Response({"errors": flatten_errors(exc.detail)}, status=400)
    if isinstance(exc, exceptions.ParseError):  # a body that is not JSON (or nested too deeply): the same shape
        return Response({"errors": [{"loc": "", "msg": str(exc.detail)}]}, status=400)
    return exception_handler(exc, context)


class RunsErrorsMixin:
    """Views of this app answer with the error shapes above."""

    def get_exception_handler(self):
        return runs_exception_handler


# The OpenAPI shapes of the two error bodies, for `extend_schema(responses={400: ..., 409: ...})`.
ERRORS_RESPONSE = inline_serializer(
    "ValidationErrors",
    fields={
        "errors": serializers.ListField(
            child=inline_serializer(
                "FieldError", fields={"loc": serializers.CharField(), "msg": serializers.CharField()}
            )
        )
    },
)
CONFLICT_RESPONSE = inline_serializer(
    "StateConflict", fields={"detail": serializers.CharField(), "state": serializers.CharField()}
)


class FileFormatNegotiation(BaseContentNegotiation):
    """For file downloads whose `?format=` names the file type, not a DRF renderer; errors answer in JSON."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return JSONRenderer(), JSONRenderer.media_type
