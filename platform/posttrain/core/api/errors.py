"""The error contract in DRF: one exception handler for every API view and one OpenAPI component.

`api_exception_handler` (settings.REST_FRAMEWORK["EXCEPTION_HANDLER"]) answers the platform's
ServiceErrors, Django's and DRF's ValidationError, 404, 403, 401, 405, parse errors and throttling alike,
and a database outage as 503 with Retry-After (a client retries, as the engine's event sender does):

    {"errors": [{"loc": "rewards[1].weight", "msg": "..."}], ...the error's context (state, expected_seq)}

`ERRORS_RESPONSE` is the body's OpenAPI component (`Errors`); posttrain.core.api.schema adds it to every
endpoint's error responses, and views name it for the codes only they answer (`responses={409: ERRORS_RESPONSE}`).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import InterfaceError, OperationalError
from django.http import Http404, JsonResponse
from rest_framework import exceptions, serializers
from rest_framework.response import Response
from rest_framework.views import exception_handler, set_rollback

from posttrain.core.errors import DatabaseUnavailable, FieldError, ServiceError


def field_errors(detail: Any, prefix: str = "") -> list[FieldError]:
    """DRF's nested error detail as `{"loc", "msg"}` items (`rewards[1].weight`)."""
    if isinstance(detail, dict):
        out = []
        for key, value in detail.items():
            if key in ("non_field_errors", "detail", NON_FIELD_ERRORS):
                out += field_errors(value, prefix)
            elif isinstance(key, int):  # ListField child errors are keyed by index
                out += field_errors(value, f"{prefix}[{key}]")
            else:
                out += field_errors(value, f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(detail, list):
        out = []
        for i, item in enumerate(detail):
            if isinstance(item, (dict, list)):
                if item:  # ListSerializer: {} for the valid children
                    out += field_errors(item, f"{prefix}[{i}]")
            else:
                out.append({"loc": prefix, "msg": str(item)})
        return out
    return [{"loc": prefix, "msg": str(detail)}]


def django_field_errors(exc: DjangoValidationError) -> list[FieldError]:
    """Django's ValidationError (keyed by field, or a plain list) as `{"loc", "msg"}` items."""
    return field_errors(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)


def api_exception_handler(exc: Exception, context: dict) -> Response | None:
    """Every error an API view raises, in the contract's shape; None (a 500) for anything else: a bug."""
    if isinstance(exc, (OperationalError, InterfaceError)):  # the database, not the request, is at fault
        unavailable = DatabaseUnavailable()
        headers = {"Retry-After": str(unavailable.retry_after_s)}
        return Response(unavailable.payload(), status=unavailable.status_code, headers=headers)
    if isinstance(exc, ServiceError):
        set_rollback()
        return Response(exc.payload(), status=exc.status_code)
    if isinstance(exc, DjangoValidationError):
        set_rollback()
        return Response({"errors": django_field_errors(exc)}, status=400)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(*exc.args)
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(*exc.args)
    response = exception_handler(exc, context)  # DRF's: status, WWW-Authenticate, Retry-After, rollback
    if response is not None and isinstance(exc, exceptions.APIException):
        response.data = {"errors": field_errors(exc.detail)}
    return response


def error_response(exc: ServiceError) -> JsonResponse:
    """The contract from a plain Django view (the Server-Sent Events stream is not a DRF view)."""
    return JsonResponse(exc.payload(), status=exc.status_code)


class FieldErrorSerializer(serializers.Serializer):
    loc = serializers.CharField(
        help_text='What is at fault: a field path (`rewards[0].weight`), a query parameter or a header; "" for '
        "the request as a whole."
    )
    msg = serializers.CharField(help_text="What is wrong, in a sentence meant for a person.")


class ErrorsSerializer(serializers.Serializer):
    errors = FieldErrorSerializer(many=True)
    state = serializers.CharField(required=False, help_text="409 on a state change: the object's state now.")
    expected_seq = serializers.IntegerField(
        required=False, help_text="409 on event ingestion: the seq to send next (the engine re-sends from it)."
    )


ERRORS_RESPONSE = ErrorsSerializer
