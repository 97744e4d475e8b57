"""`GET /api/runs/<id>/stream/`: the browser stream's endpoint, Server-Sent Events (the messages:
posttrain.telemetry.browser_stream; the page's side: frontend/static/js/browser_stream_client.js).

An async view: under ASGI an open stream costs a coroutine and, while it waits, a pooled thread, not a
worker process. Access is the runs API's (session user, or `Authorization: Token <key>` as the CLI's
`runs follow` sends it; researcher or admin), and so are its errors: the error contract
(posttrain.core.errors), though this is a plain Django view, not a DRF one.

The resume point is the `Last-Event-ID` header (EventSource sends it when it reconnects), else
`?last_event_id=` (the page's first connection: the seq its initial REST reads covered), else 0.
"""

from __future__ import annotations

import uuid
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from posttrain.accounts.roles import Role
from posttrain.accounts.selectors import user_role, user_roles
from posttrain.core.api.errors import error_response
from posttrain.core.errors import (
    InvalidInput,
    MethodNotAllowed,
    NotAuthenticated,
    NotFound,
    PermissionDenied,
    ServiceError,
)
from posttrain.projects.access import readable
from posttrain.runs.models import Run
from posttrain.telemetry.browser_stream import run_stream
from posttrain.telemetry.event_schema import MAX_INT64

ALLOWED_ROLES = frozenset({Role.RESEARCHER, Role.ADMIN})


def _token_user(key: str):
    from rest_framework.authentication import TokenAuthentication
    from rest_framework.exceptions import AuthenticationFailed

    try:
        return TokenAuthentication().authenticate_credentials(key)[0]
    except AuthenticationFailed:
        return None


async def check_access(request: HttpRequest) -> Any:
    """The user the request is from (by its API token or its session), or the runs API's refusals: 401 for a token
    it does not know, 403 when not signed in (session authentication sends no challenge, so DRF never says 401), 403
    naming the role otherwise."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "token" and key.strip():
        user = await sync_to_async(_token_user)(key.strip())
        if user is None:
            raise NotAuthenticated("Invalid token.")
    else:
        user = await request.auser()
    if not user.is_authenticated:
        raise PermissionDenied("Authentication credentials were not provided.")
    if not await sync_to_async(user_roles)(user) & ALLOWED_ROLES:
        role = await sync_to_async(user_role)(user)
        raise PermissionDenied(
            f"Only researchers and admins may use this endpoint; your role is {role or 'none (ask an admin)'}."
        )
    return user


def resume_point(request: HttpRequest) -> int:
    """The seq the client already has; InvalidInput naming the header or parameter when it is not one."""
    header = request.headers.get("Last-Event-ID", "").strip()
    loc, raw = ("Last-Event-ID", header) if header else ("last_event_id", request.GET.get("last_event_id", "").strip())
    if not raw:
        return 0
    if not raw.isdigit() or not raw.isascii() or int(raw) > MAX_INT64:
        raise InvalidInput.one(loc, f"must be an event seq (an integer between 0 and {MAX_INT64}), got {raw[:50]!r}")
    return int(raw)


def _readable_run_exists(user, pk: uuid.UUID) -> bool:
    return readable(Run.objects.filter(pk=pk), user).exists()


async def run_stream_view(request: HttpRequest, pk: uuid.UUID) -> HttpResponse | StreamingHttpResponse:
    if request.method != "GET":
        refusal = error_response(MethodNotAllowed(request.method or ""))
        refusal["Allow"] = "GET"
        return refusal
    try:
        # A token client's user is not request.user (no DRF here): the check names who the request is from.
        user = await check_access(request)
        after = resume_point(request)
        if not await sync_to_async(_readable_run_exists)(user, pk):
            raise NotFound("No Run matches the given query.")
    except ServiceError as exc:
        return error_response(exc)
    response = StreamingHttpResponse(
        run_stream(pk, after, keepalive_s=settings.SSE_KEEPALIVE_S, max_s=settings.SSE_MAX_STREAM_S),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx and friends must pass each message on at once
    return response
