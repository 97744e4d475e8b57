"""Request bodies bounded before they are read, on the real web server (uvicorn as scripts/demo.sh starts it, the
app behind posttrain.core.request_bounds): the demo's attack, an anonymous chunked PUT to a run's upload URL that
never ends, is refused at once, while the web process reads a small part of what the client pushes and writes
nothing of it anywhere; a signed-in client's chunked body past its cap is cut off with a 413; headers past the
server's limit are a 400; a researcher signed in through the login form still uploads a dataset. The web answers
after each. The middleware's cases one by one: tests/unit/platform/test_request_bounds.py."""

from __future__ import annotations

import json
import socket
import uuid
from urllib.parse import urlsplit

import pytest
import requests

from bench.request_bounds import Answer, WebProcess, repeated, send_request
from tests.security.helpers import api_for, assert_stack_alive
from tests.support.stack import PlatformStack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MiB = 1 << 20


def pushed_until_answered(url: str, method: str, path: str, headers: dict[str, str]) -> Answer:
    """A chunked body of up to 256 MiB, pushed as fast as the server takes it until it answers (the client of
    bench/request_bounds.py). Before the bound, the server read all of it and answered only then."""
    return send_request(url, method, path, headers, repeated(b"x" * MiB, 256 * MiB), declared=None, timeout_s=60)


def test_a_huge_anonymous_chunked_upload_is_refused_before_the_web_server_reads_it(stack: PlatformStack):
    """As in the attack on the demo (a body that does not end; 256 MiB here): the answer comes at once, the web
    process read a small part of what the client pushed and wrote nothing of it (Django spooled all of it to a
    temporary file before the body was bounded)."""
    web = WebProcess(stack.web.process.pid)
    before = web.io()
    upload = f"/api/runs/{uuid.uuid4()}/rollouts/step_00000001.parquet/upload"
    answer = pushed_until_answered(stack.web.url, "PUT", upload, {"Content-Type": "application/vnd.apache.parquet"})
    after = web.io()

    assert answer.status == 401 and answer.headers["connection"] == "close"
    assert json.loads(answer.body)["errors"][0]["msg"].startswith("send the run's ingestion token")
    assert after["rchar"] - before["rchar"] < 2 * MiB, (answer.sent, before, after)
    assert after["wchar"] - before["wchar"] < MiB, (answer.sent, before, after)
    assert_stack_alive(stack)


def test_a_signed_in_clients_chunked_body_past_its_cap_is_cut_off_with_a_413(stack: PlatformStack, settings):
    """An API post (cap: REQUEST_BODY_MAX_BYTES["api_json"]) with a researcher's token: counted as it streams in,
    answered 413 past the cap, and nothing more is read."""
    cap = settings.REQUEST_BODY_MAX_BYTES["api_json"]
    web = WebProcess(stack.web.process.pid)
    api = api_for(stack, "ada")
    before = web.io()
    headers = {"Authorization": api.session.headers["Authorization"], "Content-Type": "application/json"}
    answer = pushed_until_answered(stack.web.url, "POST", "/api/experiments/", headers)
    after = web.io()

    assert answer.status == 413 and answer.headers["connection"] == "close"
    message = json.loads(answer.body)["errors"][0]["msg"]
    assert message.startswith(f"the body grew past {cap} bytes; an API request's body may have at most {cap} bytes")
    assert after["rchar"] - before["rchar"] < cap + 4 * MiB, (answer.sent, before, after)
    assert_stack_alive(stack)


def test_headers_past_the_servers_limit_are_refused_and_the_web_still_answers(stack: PlatformStack):
    """uvicorn parses with h11 (scripts/demo.sh's WEB_FLAGS), which caps a request's line and headers at 1 MiB:
    httptools, its default, held 200 MiB of one header in memory without a word."""
    url = urlsplit(stack.web.url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"GET /api/health/ HTTP/1.1\r\nHost: x\r\nX-Padding: ")
        try:
            for _ in range(4):
                sock.sendall(b"a" * MiB)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed while we were still sending
        status_line = sock.recv(200).split(b"\r\n")[0]
    assert status_line == b"HTTP/1.1 400 Bad Request"
    assert_stack_alive(stack)


def test_a_researcher_signed_in_through_the_login_form_still_uploads_a_dataset(stack: PlatformStack):
    """The browser's way, through the middleware: the login form (open, small cap), then a multipart upload with
    the session's cookie and its CSRF token."""
    from tests.unit.platform.helpers import PASSWORD, a_researcher

    a_researcher("grace")
    browser = requests.Session()
    browser.get(f"{stack.web.url}/login/", timeout=30)
    form = {"username": "grace", "password": PASSWORD, "csrfmiddlewaretoken": browser.cookies["csrftoken"]}
    signed_in = browser.post(f"{stack.web.url}/login/", data=form, allow_redirects=False, timeout=60)
    assert signed_in.status_code == 302 and "sessionid" in browser.cookies
    upload = browser.post(
        f"{stack.web.url}/api/datasets/",
        files={"file": ("sums.jsonl", '{"prompt": "1+1=", "label": "2"}\n')},
        data={"name": "sums"},
        headers={"X-CSRFToken": browser.cookies["csrftoken"], "Referer": f"{stack.web.url}/registry/"},
        timeout=60,
    )
    assert upload.status_code == 201, upload.text
