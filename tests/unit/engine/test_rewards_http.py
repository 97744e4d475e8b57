"""HttpReward against a real http.server on 127.0.0.1, speaking OpenRLHF's protocol. Loopback is refused by the
outbound policy unless an admin allows it: these tests allow it, as an admin running a local reward server would
(POSTTRAIN_HTTP_ALLOW); the policy's refusals are tested in test_outbound.py."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rl_engine.rewards import HttpReward, RewardBatch


class RewardServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[dict] = []
        self.behaviour = "ok"  # see Handler.do_POST
        self.failures_left = 0
        self.lock = threading.Lock()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}/get_reward"


class Handler(BaseHTTPRequestHandler):
    server: RewardServer

    def log_message(self, *args):  # keep test output quiet
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.requests.append({"body": body, "headers": dict(self.headers)})
            fail_now = self.server.failures_left > 0
            self.server.failures_left -= 1
        behaviour = self.server.behaviour
        queries = body["query"]
        rewards = [float(len(q)) for q in queries]
        if behaviour == "fail_first" and fail_now:
            return self.reply(500, b"overloaded")
        if behaviour == "not_found":
            return self.reply(404, b"no such route")
        if behaviour == "slow":
            time.sleep(1.0)
        if behaviour == "bad_json":
            return self.reply(200, b"<html>oops</html>")
        if behaviour == "short":
            rewards = rewards[:-1]
        if behaviour == "bare_list":
            return self.reply(200, json.dumps(rewards).encode())
        if behaviour == "rewards_only":
            return self.reply(200, json.dumps({"rewards": rewards}).encode())
        payload = {
            "rewards": rewards,
            "scores": [r / 10 for r in rewards],
            "extra_logs": {"server_batch": float(len(queries))},
        }
        self.reply(200, json.dumps(payload).encode())

    def reply(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(autouse=True)
def loopback_allowed(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_HTTP_ALLOW", "127.0.0.1")


@pytest.fixture
def server():
    srv = RewardServer()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(5)


def make_batch(n=3):
    prompts = [f"prompt {i} " for i in range(n)]
    responses = ["x" * (i + 1) for i in range(n)]
    return RewardBatch.build(prompts, responses, [f"label{i}" for i in range(n)])


def test_posts_openrlhf_payload_and_reads_rewards_scores_and_extra_logs(server):
    batch = make_batch(3)
    result = HttpReward(server.url, headers={"Authorization": "Bearer t0k"}).score(batch)

    assert result.scores == [float(len(q)) for q in batch.queries]
    assert result.errors == [None] * 3
    assert result.extra_logs["scores"] == [s / 10 for s in result.scores]
    assert result.extra_logs["server_batch"] == 3.0
    (request,) = server.requests
    assert request["body"] == {"query": batch.queries, "prompts": batch.prompts, "labels": batch.labels}
    assert request["headers"]["Authorization"] == "Bearer t0k"
    assert request["headers"]["Content-Type"] == "application/json"


@pytest.mark.parametrize("behaviour", ["bare_list", "rewards_only"])
def test_accepts_a_bare_list_or_rewards_only(server, behaviour):
    server.behaviour = behaviour
    batch = make_batch(2)
    assert HttpReward(server.url).score(batch).scores == [float(len(q)) for q in batch.queries]


def test_server_error_is_retried_until_it_succeeds(server):
    server.behaviour, server.failures_left = "fail_first", 2
    result = HttpReward(server.url, retries=3, backoff_s=0.01).score(make_batch(2))
    assert result.errors == [None, None]
    assert len(server.requests) == 3


def test_persistent_server_error_fails_the_batch_naming_url_attempts_and_status(server):
    server.behaviour, server.failures_left = "fail_first", 100
    result = HttpReward(server.url, retries=2, backoff_s=0.01).score(make_batch(2))
    assert result.scores == [0.0, 0.0]
    assert (
        result.errors
        == [f"POST {server.url} failed after 3 attempts: HTTP 500 Internal Server Error (a 10-byte answer)"] * 2
    )
    assert len(server.requests) == 3


def test_client_error_is_not_retried(server):
    server.behaviour = "not_found"
    result = HttpReward(server.url, retries=3, backoff_s=0.01).score(make_batch(1))
    assert result.errors == [f"POST {server.url} failed: HTTP 404 Not Found (a 13-byte answer)"]  # never the body
    assert len(server.requests) == 1


def test_slow_server_times_out_after_each_attempt(server):
    server.behaviour = "slow"
    started = time.monotonic()
    result = HttpReward(server.url, timeout_s=0.2, retries=1, backoff_s=0.01).score(make_batch(2))
    assert time.monotonic() - started < 1.5
    assert result.errors == [f"POST {server.url} failed after 2 attempts: timed out after 0.2s"] * 2


def test_unreachable_server_fails_with_the_connection_error():
    with socket.socket() as sock:  # a port that nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    result = HttpReward(url, retries=1, backoff_s=0.01).score(make_batch(1))
    assert result.errors[0].startswith(f"POST {url} failed after 2 attempts: ConnectionRefusedError")


def test_response_that_is_not_json_fails_without_retry(server):
    server.behaviour = "bad_json"
    result = HttpReward(server.url, backoff_s=0.01).score(make_batch(2))
    assert result.errors == [f"POST {server.url} failed: response is not JSON (a 17-byte answer)"] * 2
    assert len(server.requests) == 1


def test_wrong_number_of_rewards_fails_the_batch(server):
    server.behaviour = "short"
    result = HttpReward(server.url).score(make_batch(3))
    assert result.errors == [f"POST {server.url}: server returned 2 rewards for 3 samples"] * 3


def test_big_batch_is_split_into_chunks_and_reassembled_in_order(server):
    batch = make_batch(5)
    result = HttpReward(server.url, batch_size=2).score(batch)
    assert result.scores == [float(len(q)) for q in batch.queries]
    assert sorted(len(r["body"]["query"]) for r in server.requests) == [1, 2, 2]
    # A per-request scalar curve counts once per sample in the batch mean.
    assert result.extra_logs["server_batch"] == [2.0, 2.0, 2.0, 2.0, 1.0]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"url": "ftp://x"}, "url"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"retries": -1}, "retries"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_invalid_settings_are_rejected_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        HttpReward(**{"url": "http://127.0.0.1:1/", **kwargs})
