"""Request bodies bounded before they are read (docs/SECURITY.md, "Request bodies").

Django's ASGI handler reads a request's whole body into a temporary file before any middleware, authentication or
view runs, and uvicorn sets no limit: an anonymous PUT declaring 10^12 bytes had 400 MiB on disk in a second. This
ASGI middleware wraps Django's application (posttrain.asgi) and, for each request, before Django reads a byte:

- picks the request's route in `ROUTES` (method and path; first match) and its cap, a key of
  settings.REQUEST_BODY_MAX_BYTES;
- refuses a declared Content-Length over the cap at once (413), the body unread;
- for an unsafe method that carries a body (a Content-Length over 0, or a Transfer-Encoding), checks the credentials
  the route takes (a live session's cookie or an API token; the run's own bearer token for the engine's routes;
  none for the login routes) and refuses the request without them (401/403, as the view would), the body unread;
- counts the body as it streams in (a chunked body declares no length): past the cap, Django
  is told the client left (it drops what it spooled) and the client gets a 413; nothing more is read.

Every refusal closes the connection (`Connection: close`): a body left unread cannot be skipped to reach the next
request. Refusals use the error contract's shape under /api/ and a line of text elsewhere, as Django's answers
there do (posttrain.core.middleware)."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from importlib import import_module
from types import SimpleNamespace
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.db import InterfaceError, OperationalError, connections
from django.http.cookie import parse_cookie

from posttrain.core.errors import (
    DatabaseUnavailable,
    IngestAuthError,
    InvalidInput,
    NotAuthenticated,
    PayloadTooLarge,
    PermissionDenied,
    ServiceError,
)
from posttrain.core.run_tokens import require_derived_run_token

Scope = dict[str, Any]
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


class Credentials(Enum):
    NONE = "none"  # the login routes: anyone may post to them (a small cap)
    USER = "user"  # a live session's cookie, or an API token (`Authorization: Token <key>`), as DRF takes them
    # The run's own bearer token: derived from SECRET_KEY and the run's id (posttrain.core.run_tokens), so checked
    # here with no database; the view checks it against the run's stored hash again.
    RUN_TOKEN = "run token"


@dataclass(frozen=True)
class BodyRoute:
    """Requests of `methods` (None: every unsafe method) whose path matches `path` whole."""

    methods: frozenset[str] | None
    path: re.Pattern[str]
    cap: str  # a key of settings.REQUEST_BODY_MAX_BYTES
    credentials: Credentials
    what: str  # what the body is, for the 413's message
    advice: str = ""

    def matches(self, method: str, path: str) -> bool:
        return (method in self.methods if self.methods else method not in SAFE_METHODS) and bool(
            self.path.fullmatch(path)
        )


def _route(
    methods: Iterable[str] | None, path: str, cap: str, credentials: Credentials, what: str, advice: str = ""
) -> BodyRoute:
    return BodyRoute(frozenset(methods) if methods else None, re.compile(path), cap, credentials, what, advice)


_UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"  # Django's <uuid:> converter
USER, RUN_TOKEN, NONE = Credentials.USER, Credentials.RUN_TOKEN, Credentials.NONE

# Which cap and which credentials each request gets: the first row that matches. docs/SECURITY.md has this table.
ROUTES: tuple[BodyRoute, ...] = (
    _route(SAFE_METHODS, ".*", "safe_method", NONE, "a GET, HEAD or OPTIONS request's body"),
    _route(
        {"POST"},
        rf"/api/runs/(?P<run>{_UUID})/events/?",
        "events",
        RUN_TOKEN,
        "an event batch",
        "send fewer events per batch",
    ),
    # Any name, a decoded slash included: the run's token holder hears the view's (or the router's) answer about it.
    _route({"PUT"}, rf"/api/runs/(?P<run>{_UUID})/rollouts/.+/upload", "rollout_upload", RUN_TOKEN, "a rollout file"),
    _route({"POST"}, "/api/datasets/", "dataset_upload", USER, "a dataset upload (the file and its form)"),
    _route({"POST"}, "/api/models/import-gguf/", "gguf_upload", USER, "a GGUF model upload (the file and its form)"),
    _route(None, "/api/(?:rewards|environments)/.*", "user_code", USER, "a reward's or environment's request"),
    _route({"POST"}, "/api/auth/token/|/login/|/admin/login/|/logout/", "login", NONE, "a login request"),
    _route(None, "/api/.*", "api_json", USER, "an API request's body"),
    _route(None, ".*", "form", USER, "a form"),
)


def route_for(method: str, path: str) -> BodyRoute:
    return next(route for route in ROUTES if route.matches(method, path))


def cap_bytes(route: BodyRoute) -> int:
    return int(settings.REQUEST_BODY_MAX_BYTES[route.cap])


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB" if size >= 1 << 20 else f"{size / 1024:.0f} KiB"


def too_large(route: BodyRoute, limit: int, declared: int | None) -> PayloadTooLarge:
    """The 413: how big the body was (declared, or past the cap as it streamed in) and the limit, named."""
    size = f"the body has {declared} bytes" if declared is not None else f"the body grew past {limit} bytes"
    advice = f": {route.advice}" if route.advice else ""
    return PayloadTooLarge(
        f"{size}; {route.what} may have at most {limit} bytes ({_mib(limit)}, "
        f"REQUEST_BODY_MAX_BYTES[{route.cap!r}]){advice}"
    )


# --- the request's headers -------------------------------------------------------------------------------------


def header(scope: Scope, name: bytes) -> str:
    """A request header (several joined, as a Cookie header split in two must be), "" when absent."""
    values = [value.decode("latin-1") for key, value in scope.get("headers", []) if key.lower() == name]
    return "; ".join(values) if name == b"cookie" else ", ".join(values)


def carries_a_body(scope: Scope, declared: int | None) -> bool:
    """HTTP/1.1 frames a body by its Content-Length or a Transfer-Encoding: a request with neither has none."""
    return declared > 0 if declared is not None else bool(header(scope, b"transfer-encoding"))


def declared_length(scope: Scope) -> int | None:
    """The Content-Length the client declared; None for a chunked body or none at all."""
    text = header(scope, b"content-length").strip()
    if not text:
        return None
    if not text.isdigit():
        raise InvalidInput.one("Content-Length", "must be a number of bytes")
    return int(text)


# --- credentials, checked before a byte of the body is read --------------------------------------------------


def _token_user_is_active(key: str) -> bool:
    from rest_framework.authtoken.models import Token

    token = Token.objects.select_related("user").filter(key=key).first()
    return token is not None and token.user.is_active


def _session_user_is_active(session_key: str) -> bool:
    """As Django's AuthenticationMiddleware finds the session's user: an unknown or expired session, a logged-out
    one, or one whose password changed since is anonymous."""
    from django.contrib.auth import get_user

    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]  # get_user reads .session only
    return bool(user.is_authenticated and user.is_active)


def user_refusal(scope: Scope) -> ServiceError | None:
    """What DRF would answer a request with neither a valid API token nor a live session (Django's login pages
    and the admin take the session alike)."""
    keyword, _, key = header(scope, b"authorization").partition(" ")
    if keyword.lower() == "token":
        return None if key.strip() and _token_user_is_active(key.strip()) else NotAuthenticated("Invalid token.")
    session_key = parse_cookie(header(scope, b"cookie")).get(settings.SESSION_COOKIE_NAME, "")
    if session_key and _session_user_is_active(session_key):
        return None
    return PermissionDenied("Authentication credentials were not provided.")


def _user_refusal_now(scope: Scope) -> ServiceError | None:
    """Runs in a thread of its own (a fresh ThreadSensitiveContext), whose connections it closes: none is left
    open when the thread ends."""
    try:
        return user_refusal(scope)
    except (OperationalError, InterfaceError):
        return DatabaseUnavailable()
    finally:
        connections.close_all()


async def credentials_refusal(scope: Scope, route: BodyRoute) -> ServiceError | None:
    """None when the request has the credentials its route takes; else what to answer it."""
    if route.credentials is NONE:
        return None
    if route.credentials is RUN_TOKEN:
        match = route.path.fullmatch(scope["path"])
        assert match is not None  # the route was chosen by this path
        try:
            require_derived_run_token(header(scope, b"authorization"), match["run"])
        except IngestAuthError as refused:
            return refused
        return None
    # Thread-sensitive, as Django runs its own sync code; a context of its own, as each Django request has.
    async with ThreadSensitiveContext():
        return await sync_to_async(_user_refusal_now, thread_sensitive=True)(scope)


# --- answering -------------------------------------------------------------------------------------------------


async def answer(scope: Scope, send: Send, refusal: ServiceError) -> None:
    """The refusal in the error contract's shape under /api/, a line of text elsewhere; the connection closes."""
    if scope["path"].startswith("/api/"):
        body, content_type = json.dumps(refusal.payload()).encode(), b"application/json"
    else:
        body, content_type = str(refusal).encode(), b"text/plain; charset=utf-8"
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if isinstance(refusal, DatabaseUnavailable):
        headers.append((b"retry-after", str(refusal.retry_after_s).encode()))
    elif refusal.status_code == 401:
        scheme = b"Bearer" if isinstance(refusal, IngestAuthError) else b"Token"
        headers.append((b"www-authenticate", scheme))
    await send({"type": "http.response.start", "status": refusal.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class CountedBody:
    """The app's `receive`, counting the body: past `limit` bytes the app hears that the client left (Django then
    drops what it spooled and answers nothing) and nothing more is read. At most `limit` + one chunk is read."""

    def __init__(self, receive: Receive, limit: int):
        self._receive = receive
        self.limit = limit
        self.received = 0
        self.over = False

    async def __call__(self) -> Message:
        if self.over:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                self.over = True
                return {"type": "http.disconnect"}
        return message


class RequestBodyBounds:
    """ASGI middleware in front of Django's application (posttrain.asgi); see the module's docstring."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = route_for(scope["method"], scope["path"])
        limit = cap_bytes(route)
        try:
            declared = declared_length(scope)
        except InvalidInput as invalid:
            await answer(scope, send, invalid)
            return
        if declared is not None and declared > limit:
            await answer(scope, send, too_large(route, limit, declared))
            return
        if carries_a_body(scope, declared) and (refusal := await credentials_refusal(scope, route)):
            await answer(scope, send, refusal)
            return
        body = CountedBody(receive, limit)
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, body, send_tracked)
        if body.over and not started:
            await answer(scope, send, too_large(route, limit, None))
