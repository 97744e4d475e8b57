"""The outbound policy (rl_engine/outbound.py): which addresses a reward may reach, and how a request is made
(pinned to the checked address, no redirects, bounded in size and time, the answer never quoted), against a
real http.server on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rl_engine.outbound import OutboundFailed, OutboundPolicy, OutboundRefused, post
from rl_engine.rewards import HttpReward, RewardBatch

REFUSED = [
    ("http://127.0.0.1:8000/api/runs/", "127.0.0.1, a loopback address"),
    ("http://localhost:8265/api/jobs/", "127.0.0.1, a loopback address"),
    ("http://2130706433/", "127.0.0.1, a loopback address"),  # 127.0.0.1 written as one number
    ("http://0x7f.1/", "127.0.0.1, a loopback address"),
    ("http://[::1]:8265/", "::1, a loopback address"),
    ("http://[::ffff:127.0.0.1]/", "::ffff:7f00:1, a loopback address"),  # IPv4 inside IPv6
    ("http://[2002:7f00:1::]/", "2002:7f00:1::, a loopback address"),  # 6to4 around 127.0.0.1
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254, a link-local address"),
    ("http://[fe80::1]/", "fe80::1, a link-local address"),
    ("http://10.1.2.3/", "10.1.2.3, a private address"),
    ("http://192.168.0.1/", "192.168.0.1, a private address"),
    ("http://[fd00::2]/", "fd00::2, a private address"),
    ("http://100.64.0.1/", "100.64.0.1, a non-global address"),
    ("http://224.0.0.1/", "224.0.0.1, a multicast address"),
    ("http://0.0.0.0/", "0.0.0.0, an unspecified address"),
]


@pytest.mark.parametrize(("url", "why"), REFUSED, ids=[url for url, _ in REFUSED])
def test_loopback_link_local_private_multicast_and_unspecified_are_refused(url, why):
    with pytest.raises(OutboundRefused) as refused:
        OutboundPolicy().check_url(url)
    assert f"resolves to {why}; an admin may allow it (POSTTRAIN_HTTP_ALLOW)" in str(refused.value)


def test_the_clusters_own_hosts_are_refused_even_on_a_public_address():
    policy = OutboundPolicy(deny=["8.8.8.8", "posttrain.example.org"])
    with pytest.raises(OutboundRefused, match="8.8.8.8 is the cluster's own address 8.8.8.8"):
        policy.check_url("http://8.8.8.8/score")
    assert policy.check_url("http://8.8.4.4/score").address == "8.8.4.4"


@pytest.mark.parametrize(
    ("allow", "url", "allowed"),
    [
        ("127.0.0.1", "http://127.0.0.1:9000/", True),
        ("127.0.0.0/8", "http://127.0.0.2/", True),
        ("127.0.0.1:9000", "http://127.0.0.1:9000/", True),
        ("127.0.0.1:9000", "http://127.0.0.1:8000/", False),  # the port the admin named only
        ("localhost", "http://localhost:9000/", True),
        ("localhost", "http://127.0.0.1:9000/", False),  # a host entry allows that name, not its address
        ("[::1]:9000", "http://[::1]:9000/", True),
    ],
)
def test_an_admin_allows_hosts_addresses_networks_and_ports(allow, url, allowed):
    policy = OutboundPolicy.from_env({"POSTTRAIN_HTTP_ALLOW": allow})
    if allowed:
        assert policy.check_url(url).address
    else:
        with pytest.raises(OutboundRefused):
            policy.check_url(url)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.org/", "must be an http:// or https:// URL"),
        ("http:///x", "must be an http:// or https:// URL with a host"),
        ("http://user:secret@example.org/", "must not carry credentials"),
        ("http://example.org:99999/", "has a port that is not a number"),
    ],
)
def test_a_url_of_another_shape_is_refused_naming_the_rule(url, message):
    with pytest.raises(OutboundRefused, match=message):
        OutboundPolicy().check_url(url)


def test_a_host_that_does_not_resolve_passes_registration_and_fails_the_request():
    policy = OutboundPolicy()
    assert policy.check_url("http://rm.invalid/score", resolve="if_possible").address == ""
    with pytest.raises(OutboundFailed, match="cannot resolve rm.invalid"):
        policy.check_url("http://rm.invalid/score")


# --- requests against a real server --------------------------------------------------------------------------


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.hosts: list[str] = []
        self.behaviour = "ok"

    @property
    def port(self) -> int:
        return self.server_address[1]


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.hosts.append(self.headers["Host"])
        behaviour = self.server.behaviour
        if behaviour == "redirect":
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif behaviour == "huge":
            self.send_response(200)
            self.send_header("Content-Length", str(64 * 1024 * 1024))
            self.end_headers()
            self.wfile.write(b"[" * 1024)
        elif behaviour == "endless":  # no Content-Length: an answer that never stops
            self.send_response(200)
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"1," * 4096)
            except OSError:
                pass
        elif behaviour == "trickle":  # one byte at a time, each well within a socket timeout
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                pass
        elif behaviour == "secret":
            body = b'{"detail": "root:x:0:0:root:/root:/bin/bash"}'
            self.send_response(418, "root:x:0:0")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            body = b"[1.0]"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)


@pytest.fixture
def server():
    srv = Server()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def loopback() -> OutboundPolicy:
    return OutboundPolicy(allow=["127.0.0.1", "localhost"])


def test_the_request_goes_to_the_address_checked_not_to_a_second_lookup(server, monkeypatch):
    """DNS rebinding: the name resolves to an allowed address when checked and to another one a moment later;
    the connection goes to the first, and the Host header still names the host."""
    target = loopback().check_url(f"http://localhost:{server.port}/score")
    real = socket.getaddrinfo

    def rebound(host, *args, **kwargs):
        if host == "localhost":
            return real("169.254.169.254", *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebound)
    response = post(target, b"{}", {"Content-Type": "application/json"}, timeout_s=5)
    assert (response.status, response.body) == (200, b"[1.0]")
    assert server.hosts == [f"localhost:{server.port}"]


def test_a_redirect_is_not_followed(server):
    server.behaviour = "redirect"
    reward = HttpReward(f"http://127.0.0.1:{server.port}/score", retries=0, policy=loopback())
    result = reward.score(RewardBatch.build(["p"], ["r"]))
    assert result.errors == [
        f"POST http://127.0.0.1:{server.port}/score failed: HTTP 302 Found (a 0-byte answer): redirects are not followed"
    ]
    assert len(server.hosts) == 1


def test_an_answer_over_the_size_limit_is_refused_by_its_length_or_as_it_grows(server):
    target = loopback().check_url(f"http://127.0.0.1:{server.port}/")
    server.behaviour = "huge"
    with pytest.raises(OutboundFailed, match="a 67108864-byte answer, over the 1048576-byte limit"):
        post(target, b"{}", {}, timeout_s=5, max_bytes=1024 * 1024)
    server.behaviour = "endless"
    with pytest.raises(OutboundFailed, match="the answer went over the 1048576-byte limit"):
        post(target, b"{}", {}, timeout_s=5, max_bytes=1024 * 1024)


def test_a_trickling_answer_ends_at_the_whole_requests_deadline(server):
    server.behaviour = "trickle"
    target = loopback().check_url(f"http://127.0.0.1:{server.port}/")
    started = time.monotonic()
    with pytest.raises(OutboundFailed, match="timed out after 0.5s"):
        post(target, b"{}", {}, timeout_s=0.5)
    assert time.monotonic() - started < 2.0  # each byte came within a socket timeout; the deadline is the total


def test_an_error_answer_is_reported_by_status_and_size_never_its_words(server):
    server.behaviour = "secret"
    reward = HttpReward(f"http://127.0.0.1:{server.port}/score", retries=0, policy=loopback())
    [error] = reward.score(RewardBatch.build(["p"], ["r"])).errors
    assert error == f"POST http://127.0.0.1:{server.port}/score failed: HTTP 418 I'm a Teapot (a 45-byte answer)"
    assert "root" not in error


def test_without_the_admins_allow_list_the_reward_never_connects(server):
    reward = HttpReward(f"http://127.0.0.1:{server.port}/score", retries=3, backoff_s=0.01, policy=OutboundPolicy())
    [error] = reward.score(RewardBatch.build(["p"], ["r"])).errors
    assert error.endswith(
        "failed: refused by the outbound policy: 127.0.0.1 resolves to 127.0.0.1, a loopback address; "
        "an admin may allow it (POSTTRAIN_HTTP_ALLOW)"
    )
    assert server.hosts == []  # refused before any connection, and not retried
