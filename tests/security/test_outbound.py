"""HTTP rewards under the outbound policy, on the real stack (issue case 5, delivery 3): a researcher aims a
reward at the platform, Ray's job API, cloud metadata, loopback and private addresses; all are refused when the
reward is registered and again when it runs (a reward stored before, or a name that resolves elsewhere later);
redirects are not followed and no answer is quoted; another run's agent endpoint gives no task without that run's
own token. The admin allowed two loopback ports (tests/security/conftest.py): the test's own reward server and an
agent endpoint, nothing else of this machine."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.security.helpers import SECRET_MARK, Api, World, api_for, assert_stack_alive, server_logs
from tests.support.stack import PlatformStack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ALLOW = "an admin may allow it (POSTTRAIN_HTTP_ALLOW)"


def hostile_urls(stack: PlatformStack) -> list[tuple[str, str]]:
    web = stack.web.port
    return [
        (f"http://127.0.0.1:{web}/api/runs/", "127.0.0.1 resolves to 127.0.0.1, a loopback address"),
        (f"http://localhost:{web}/admin/", "localhost resolves to 127.0.0.1, a loopback address"),
        ("http://127.0.0.1:8265/api/jobs/", "127.0.0.1 resolves to 127.0.0.1, a loopback address"),
        ("http://[::1]:8265/api/jobs/", "::1 resolves to ::1, a loopback address"),
        (f"http://2130706433:{web}/", "2130706433 resolves to 127.0.0.1, a loopback address"),
        ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1 resolves to ::ffff:7f00:1, a loopback address"),
        (
            "http://169.254.169.254/latest/meta-data/",
            "169.254.169.254 resolves to 169.254.169.254, a link-local address",
        ),
        ("http://10.0.0.1/score", "10.0.0.1 resolves to 10.0.0.1, a private address"),
        ("http://192.168.1.1/score", "192.168.1.1 resolves to 192.168.1.1, a private address"),
        ("http://0.0.0.0:6379/", "0.0.0.0 resolves to 0.0.0.0, an unspecified address"),
    ]


def test_a_reward_aimed_inside_the_cluster_is_refused_at_registration(stack: PlatformStack, world: World):
    from posttrain.registry.models import RewardFunction

    api = api_for(stack, "mallory")
    for url, why in hostile_urls(stack):
        response = api.post("/api/rewards/", {"name": "ssrf", "kind": "http", "spec": {"url": url}})
        assert response.status_code == 400, (url, response.text)
        assert response.json()["errors"] == [{"loc": "spec.url", "msg": f"{why}; {ALLOW}"}], url
    assert not RewardFunction.objects.filter(name="ssrf").exists()
    assert_stack_alive(stack)


def test_a_stored_reward_aimed_inside_the_cluster_is_refused_again_when_it_runs(stack: PlatformStack, world: World):
    """A reward stored before the policy (or whose name resolves elsewhere by now): "Try it" on the worker checks
    again and never connects; the web server saw no request from it."""
    from posttrain.registry.models import RewardFunction

    api = api_for(stack, "mallory")
    for url, why in hostile_urls(stack):
        reward = RewardFunction.objects.create(
            name=f"old {url}", kind="http", spec={"type": "http", "name": "old", "url": url, "retries": 0}
        )
        before = stack.web.log()
        body = api.post(f"/api/rewards/{reward.pk}/try/", {"samples": [{"prompt": "p", "response": "r"}]}).json()
        assert body["scores"] == [0.0], body
        assert body["errors"] == [[f"old: POST {url} failed: refused by the outbound policy: {why}; {ALLOW}"]], body
        assert '"POST /api/runs/' not in stack.web.log()[len(before) :]
    assert_stack_alive(stack)


class Reward(ThreadingHTTPServer):
    """A reward server an admin allowed (its port is in POSTTRAIN_HTTP_ALLOW) that misbehaves: redirects into the
    cluster, or answers an error whose body is a secret."""

    daemon_threads = True

    def __init__(self, port: int, web_port: int):
        super().__init__(("127.0.0.1", port), RewardHandler)
        self.web_port = web_port
        self.behaviour = "redirect"


class RewardHandler(BaseHTTPRequestHandler):
    server: Reward

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.server.behaviour == "redirect":
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{self.server.web_port}/api/runs/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = f"{SECRET_MARK} root:x:0:0:root:/root:/bin/bash".encode()
        self.send_response(500, SECRET_MARK)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def reward_server(stack: PlatformStack, world: World) -> Iterator[Reward]:
    server = Reward(world.reward_server_port, stack.web.port)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _try(api: Api, reward_id: int) -> dict:
    return api.post(f"/api/rewards/{reward_id}/try/", {"samples": [{"prompt": "p", "response": "r"}]}).json()


def test_an_allowed_server_cannot_redirect_into_the_cluster_nor_have_its_answer_quoted(
    stack: PlatformStack, world: World, reward_server: Reward
):
    api = api_for(stack, "mallory")
    url = f"http://127.0.0.1:{world.reward_server_port}/score"
    created = api.post("/api/rewards/", {"name": "allowed", "kind": "http", "spec": {"url": url, "retries": 0}})
    assert created.status_code == 201, created.text
    before = stack.web.log()
    body = _try(api, created.json()["id"])
    assert body["errors"] == [
        [f"allowed: POST {url} failed: HTTP 307 Temporary Redirect (a 0-byte answer): redirects are not followed"]
    ]
    assert (
        '"GET /api/runs/' not in stack.web.log()[len(before) :]
        and '"POST /api/runs/' not in stack.web.log()[len(before) :]
    )
    reward_server.behaviour = "secret"
    body = _try(api, created.json()["id"])
    size = len(f"{SECRET_MARK} root:x:0:0:root:/root:/bin/bash")
    assert body["errors"] == [
        [f"allowed: POST {url} failed after 1 attempts: HTTP 500 Internal Server Error (a {size}-byte answer)"]
    ]
    world.assert_never_quoted(*api.seen, *server_logs(stack))
    assert_stack_alive(stack)


def test_another_runs_agent_endpoint_gives_no_task_to_a_request_without_that_runs_token(
    stack: PlatformStack, world: World
):
    """Even where an admin allowed its port, a reward (or anything else on the machine) that finds a run's agent
    endpoint is refused before the endpoint reads the request: no session is opened, no task taken."""
    from rl_engine.agent_endpoint import AgentExecutor
    from rl_engine.config import validate_config

    victim = validate_config(
        {
            "name": "victim",
            "model": {"path": "m"},
            "data": {"path": "d.jsonl"},
            "agent": {"port": world.agent_port},
            "logging": {"run_dir": str(world.home / "victim-run")},
        }
    )
    executor = AgentExecutor(None, None, victim)
    try:
        api = api_for(stack, "mallory")
        url = f"http://127.0.0.1:{world.agent_port}/sessions"
        created = api.post("/api/rewards/", {"name": "thief", "kind": "http", "spec": {"url": url, "retries": 0}})
        assert created.status_code == 201, created.text
        body = _try(api, created.json()["id"])
        assert body["errors"][0][0].startswith(f"thief: POST {url} failed: HTTP 401 Unauthorized (a ")
        assert executor._sessions == {}  # nothing was handed out
    finally:
        executor.close()
    assert_stack_alive(stack)
