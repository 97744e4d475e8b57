"""Request bodies bounded before they are read (posttrain.core.request_bounds): the middleware driven as an ASGI
app with hand-made scopes, a `receive` that counts what was taken from the client, and an inner app standing in
for Django that reads the whole body first, as Django's ASGI handler does. The credential checks look the
database up from a thread of their own, as under uvicorn: those tests commit their rows (transaction=True)."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.test import Client
from django.urls import Resolver404, resolve

from posttrain.core import request_bounds
from posttrain.core.request_bounds import USER, RequestBodyBounds, route_for
from posttrain.core.run_tokens import ingest_token
from tests.unit.platform.helpers import Endpoint, a_researcher, api_endpoints

CHUNK = 64 * 1024
MiB = 1 << 20


@dataclass
class Connection:
    """What the client sends (body chunks, taken one `receive` at a time) and what it got back."""

    chunks: list[bytes]
    taken: int = 0  # chunks the server took
    sent: list[dict[str, Any]] = field(default_factory=list)

    async def receive(self) -> dict[str, Any]:
        if self.taken >= len(self.chunks):
            await asyncio.sleep(3600)  # a client that keeps the connection open and sends nothing more
        self.taken += 1
        return {"type": "http.request", "body": self.chunks[self.taken - 1], "more_body": self.taken < len(self.chunks)}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def bytes_taken(self) -> int:
        return sum(len(chunk) for chunk in self.chunks[: self.taken])

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])

    def error(self) -> str:
        payload = json.loads(self.body)
        assert set(payload) == {"errors"} and payload["errors"][0]["loc"] == ""
        return payload["errors"][0]["msg"]


class Django:
    """Stands in for Django's ASGI handler: reads the whole body (until the end or a disconnect), then answers 200
    with the number of bytes it got."""

    def __init__(self) -> None:
        self.calls = 0
        self.received = b""
        self.disconnected = False

    async def __call__(self, scope, receive, send) -> None:
        self.calls += 1
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                return
            self.received += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(len(self.received)).encode()})


def request(
    method: str, path: str, chunks: Iterable[bytes] = (), headers: dict[str, str] | None = None, length: Any = "auto"
) -> tuple[Connection, Django]:
    """One request through the middleware; `length`: the declared Content-Length ("auto": the body's; None: a
    chunked body; "none": neither header, no body)."""
    client, django = Connection(list(chunks) or [b""]), Django()
    raw_headers = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if length == "auto":
        length = sum(len(c) for c in client.chunks)
    if length is None:
        raw_headers.append((b"transfer-encoding", b"chunked"))
    elif length != "none":
        raw_headers.append((b"content-length", str(length).encode()))
    scope = {"type": "http", "method": method, "path": path, "headers": raw_headers}
    asyncio.run(asyncio.wait_for(RequestBodyBounds(django)(scope, client.receive, client.send), timeout=30))
    return client, django


def caps(settings, **overrides: int) -> None:
    settings.REQUEST_BODY_MAX_BYTES = {**settings.REQUEST_BODY_MAX_BYTES, **overrides}


def upload_path(run_id: object) -> str:
    return f"/api/runs/{run_id}/rollouts/step_00000001.parquet/upload"


# --- caps: the declared length, the streamed bytes ----------------------------------------------------------------


def test_a_declared_length_over_the_cap_is_refused_before_a_byte_is_read(settings):
    client, django = request("PUT", upload_path(uuid.uuid4()), [b"x" * CHUNK], length=10**12)
    assert client.status == 413 and client.headers[b"connection"] == b"close"
    limit = settings.ROLLOUT_UPLOAD_MAX_BYTES
    assert client.error() == (
        f"the body has {10**12} bytes; a rollout file may have at most {limit} bytes "
        f"({limit / MiB:.1f} MiB, REQUEST_BODY_MAX_BYTES['rollout_upload'])"
    )
    assert client.taken == 0 and django.calls == 0


def test_a_declared_length_over_the_cap_is_refused_whoever_sends_it_and_as_text_outside_the_api(settings):
    caps(settings, login=1000)
    client, django = request("POST", "/login/", [b"u" * 2000])
    assert client.status == 413 and client.headers[b"content-type"].startswith(b"text/plain")
    assert client.body.decode().startswith("the body has 2000 bytes; a login request may have at most 1000 bytes")
    assert client.taken == 0 and django.calls == 0


def test_a_chunked_body_is_cut_off_past_the_cap_with_at_most_one_chunk_more_read(settings):
    caps(settings, login=4 * CHUNK)
    client, django = request("POST", "/api/auth/token/", [b"x" * CHUNK] * 1000, length=None)
    assert client.status == 413 and client.headers[b"connection"] == b"close"
    assert client.error().startswith(f"the body grew past {4 * CHUNK} bytes; a login request may have at most")
    assert client.bytes_taken <= 4 * CHUNK + CHUNK
    assert django.disconnected and django.received == b"x" * (4 * CHUNK)  # it heard the client leave: no answer
    assert len([m for m in client.sent if m["type"] == "http.response.start"]) == 1


def test_a_body_of_exactly_the_cap_goes_through_whole(settings):
    caps(settings, login=3 * CHUNK)
    client, django = request("POST", "/api/auth/token/", [b"x" * CHUNK] * 3, length=None)
    assert client.status == 200 and client.body == str(3 * CHUNK).encode()
    assert django.received == b"x" * (3 * CHUNK)


def test_a_get_with_a_body_has_a_small_cap_and_no_credential_check(settings):
    caps(settings, safe_method=100)
    refused, django = request("GET", "/api/runs/", [b"x" * 101])
    assert refused.status == 413 and django.calls == 0
    answered, django = request("GET", "/api/runs/", length="none")
    assert answered.status == 200 and django.calls == 1


def test_a_content_length_that_is_not_a_number_is_a_400_naming_the_header():
    client, django = request("POST", "/api/experiments/", [b"{}"], length="12abc")
    assert client.status == 400 and django.calls == 0
    assert json.loads(client.body) == {"errors": [{"loc": "Content-Length", "msg": "must be a number of bytes"}]}


def test_what_is_not_http_passes_through_untouched():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    asyncio.run(RequestBodyBounds(app)({"type": "lifespan"}, None, None))  # type: ignore[arg-type]
    assert seen == ["lifespan"]


# --- credentials, before the body -------------------------------------------------------------------------------


def test_an_anonymous_body_is_refused_before_it_is_read():
    """The demo's attack: an anonymous PUT to a run's upload URL (no such run), and an API post with no token."""
    upload, django = request("PUT", upload_path(uuid.uuid4()), [b"x" * CHUNK] * 8, length=None)
    assert upload.status == 401 and upload.taken == 0 and django.calls == 0
    assert upload.headers[b"www-authenticate"] == b"Bearer"
    assert upload.error() == "send the run's ingestion token as 'Authorization: Bearer <token>'"
    api, django = request("POST", "/api/experiments/", [b"{}"])
    assert api.status == 403 and api.taken == 0 and django.calls == 0
    assert api.error() == "Authentication credentials were not provided."
    page, django = request("POST", "/admin/registry/dataset/", [b"a=b"])
    assert page.status == 403 and page.body == b"Authentication credentials were not provided."


def test_an_unsafe_request_without_a_body_is_left_to_django():
    for length in (0, "none"):  # Content-Length: 0, or neither header
        client, django = request("POST", "/api/runs/x/cancel/", length=length)
        assert client.status == 200 and django.calls == 1, length


def test_the_login_routes_take_anonymous_bodies():
    for path in ("/api/auth/token/", "/login/", "/admin/login/", "/logout/"):
        client, django = request("POST", path, [b"username=ada&password=x"])
        assert client.status == 200 and django.received == b"username=ada&password=x", path


def test_the_token_derived_for_the_run_in_the_path_lets_its_body_through_and_no_other_does():
    """No database: only a holder of SECRET_KEY derives a run's token (the view then checks the stored hash)."""
    run_id = uuid.uuid4()
    good = {"Authorization": f"Bearer {ingest_token(run_id)}"}
    for method, path in [
        ("PUT", upload_path(run_id)),
        *[("POST", f"/api/runs/{run_id}/events{end}") for end in ("", "/")],
    ]:
        client, django = request(method, path, [b"PAR1", b"PAR1"], headers=good, length=None)
        assert client.status == 200 and django.received == b"PAR1PAR1", path
    another_runs = {"Authorization": f"Bearer {ingest_token(uuid.uuid4())}"}
    client, django = request("PUT", upload_path(run_id), [b"PAR1"], headers=another_runs)
    assert client.status == 403 and django.calls == 0 and client.error() == "this token is not valid for this run"
    an_api_token, django = request("PUT", upload_path(run_id), [b"PAR1"], headers={"Authorization": "Token abc"})
    assert an_api_token.status == 401 and django.calls == 0


@pytest.mark.django_db(transaction=True)
def test_an_api_token_or_a_live_session_lets_a_body_through():
    from rest_framework.authtoken.models import Token

    user = a_researcher()
    key = Token.objects.create(user=user).key
    client, django = request("POST", "/api/experiments/", [b"{}"], headers={"Authorization": f"Token {key}"})
    assert client.status == 200 and django.received == b"{}"
    browser = Client()
    browser.force_login(user)
    cookie = f"csrftoken=abc; sessionid={browser.cookies['sessionid'].value}"
    client, django = request("PATCH", "/api/runs/x/", [b"{}"], headers={"Cookie": cookie})
    assert client.status == 200 and django.received == b"{}"

    unknown, django = request("POST", "/api/experiments/", [b"{}"], headers={"Authorization": "Token nope"})
    assert unknown.status == 401 and unknown.error() == "Invalid token." and django.calls == 0
    assert unknown.headers[b"www-authenticate"] == b"Token"
    browser.logout()
    logged_out, django = request("PATCH", "/api/runs/x/", [b"{}"], headers={"Cookie": cookie})
    assert logged_out.status == 403 and django.calls == 0
    user.is_active = False
    user.save()
    inactive, django = request("POST", "/api/experiments/", [b"{}"], headers={"Authorization": f"Token {key}"})
    assert inactive.status == 401 and django.calls == 0


def test_a_database_that_cannot_be_reached_is_a_503_to_retry(monkeypatch):
    from django.db import OperationalError

    def down(key: str) -> bool:
        raise OperationalError("connection refused")

    monkeypatch.setattr(request_bounds, "_token_user_is_active", down)
    client, django = request("POST", "/api/experiments/", [b"{}"], headers={"Authorization": "Token abc"})
    assert client.status == 503 and client.headers[b"retry-after"] == b"5" and django.calls == 0


# --- the real Django application behind it ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_django_behind_it_drops_a_body_cut_off_and_only_the_413_is_answered(settings):
    """posttrain.asgi's application: Django hears the client leave while it spools the body and answers nothing."""
    from rest_framework.authtoken.models import Token

    from posttrain.asgi import application

    caps(settings, api_json=4 * CHUNK)
    key = Token.objects.create(user=a_researcher()).key
    client = Connection([b" " * CHUNK] * 100)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/experiments/",
        "raw_path": b"/api/experiments/",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Token {key}".encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
    }
    asyncio.run(asyncio.wait_for(application(scope, client.receive, client.send), timeout=30))
    assert [m["type"] for m in client.sent] == ["http.response.start", "http.response.body"]
    assert client.status == 413 and client.bytes_taken <= 5 * CHUNK


# --- the table -------------------------------------------------------------------------------------------------------


def resolvable_path(endpoint: Endpoint) -> str:
    """The endpoint's route with parameters its URL pattern takes (an id, a run's uuid, a rollout file's name)."""
    candidates = (str(uuid.uuid4()), "1", "step_00000001.parquet")
    for values in itertools.product(candidates, repeat=len(endpoint.params)):
        path = endpoint.url(**dict(zip(endpoint.params, values, strict=True)))
        try:
            resolve(path)
        except Resolver404:
            continue
        return path
    raise AssertionError(f"no parameters resolve {endpoint.key}")


def test_every_api_route_open_to_anonymous_posts_is_a_login_or_run_token_route_of_the_table():
    """A view without authentication classes checks its own credentials: the table must know which it takes, or
    the middleware would refuse its legitimate clients (or let anonymous bodies through to it)."""
    mismatched = []
    for endpoint in api_endpoints():
        if endpoint.method in request_bounds.SAFE_METHODS:
            continue
        path = resolvable_path(endpoint)
        view = resolve(path).func
        view_class = getattr(view, "cls", None) or getattr(view, "view_class", None)
        open_view = getattr(view_class, "authentication_classes", None) == []
        credentials = route_for(endpoint.method, path).credentials
        if (credentials is not USER) != open_view:
            mismatched.append(f"{endpoint.key}: {'open' if open_view else 'signed-in'} view, {credentials.value} route")
    assert mismatched == []


def test_every_route_of_the_table_has_a_cap_in_the_settings(settings):
    assert {route.cap for route in request_bounds.ROUTES} == set(settings.REQUEST_BODY_MAX_BYTES)
    assert settings.REQUEST_BODY_MAX_BYTES["events"] == settings.INGEST_MAX_BODY_BYTES
    assert settings.REQUEST_BODY_MAX_BYTES["dataset_upload"] > settings.DATASET_MAX_BYTES
    assert settings.REQUEST_BODY_MAX_BYTES["gguf_upload"] > settings.GGUF_IMPORT_MAX_BYTES
