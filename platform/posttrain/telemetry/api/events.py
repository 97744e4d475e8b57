"""`POST /api/runs/<id>/events`: the engine (or the SDK) posts its events here with the run's own bearer token.
Hop 4 of the event path (docs/ARCHITECTURE.md): the batch is read with a size limit, validated
(posttrain.telemetry.event_schema) and stored exactly once (posttrain.telemetry.ingestion)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.core.errors import InvalidInput, PayloadTooLarge
from posttrain.core.run_tokens import require_run_token
from posttrain.runs.models import Run
from posttrain.telemetry.api import serializers as s
from posttrain.telemetry.event_schema import parse_batch
from posttrain.telemetry.ingestion import events_ingest


def _reject_constant(name: str) -> Any:
    raise ValueError(f'{name} is not JSON; send non-finite numbers as the strings "nan", "inf", "-inf"')


def _json_body(request: Request) -> Any:
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise InvalidInput.one("", "invalid Content-Length header") from None
    if length > settings.INGEST_MAX_BODY_BYTES:
        raise PayloadTooLarge(
            f"the batch has {length} bytes; at most {settings.INGEST_MAX_BODY_BYTES} per request: "
            "send fewer events per batch"
        )
    stream = request.stream
    raw = stream.read(settings.INGEST_MAX_BODY_BYTES + 1) if stream is not None else b""
    if not raw:
        raise InvalidInput.one("", 'empty body; expected {"events": [...]}')
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise InvalidInput.one("", "the body must be UTF-8 encoded JSON") from None
    except RecursionError:
        raise InvalidInput.one("", "the JSON is nested too deeply") from None
    except ValueError as exc:
        raise InvalidInput.one("", f"invalid JSON: {exc}") from None


class RunEventsView(APIView):
    """The engine posts its events here with the run's own bearer token (no session, no CSRF)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]  # the per-run token is checked in post()

    @extend_schema(
        summary="Ingest a batch of the run's events (the engine's sender)",
        description="Idempotent on (run, seq): events up to the stored `last_seq` are dropped, the rest must "
        "continue at last_seq + 1 without gaps (else 409 with `expected_seq`). Authorization: Bearer <the run's "
        "ingestion token>.",
        request=s.EventBatchSerializer,
        responses={
            200: s.EventAckSerializer,
            400: ERRORS_RESPONSE,
            401: ERRORS_RESPONSE,
            403: ERRORS_RESPONSE,
            409: OpenApiResponse(
                ERRORS_RESPONSE, description="The batch does not continue the stored events: send from `expected_seq`."
            ),
            413: ERRORS_RESPONSE,
        },
    )
    def post(self, request: Request, pk) -> Response:
        stored_hash = get_object_or_404(Run.objects.only("ingest_token_hash"), pk=pk).ingest_token_hash
        require_run_token(request.META.get("HTTP_AUTHORIZATION", ""), stored_hash)
        events = parse_batch(_json_body(request), str(pk))
        result = events_ingest(pk, events)
        return Response({"acknowledged_seq": result.acknowledged_seq, "stored": result.stored})


@extend_schema_view(post=extend_schema(exclude=True))
class RunEventsNoSlashView(RunEventsView):
    """The same endpoint without the trailing slash (documented once, above)."""
