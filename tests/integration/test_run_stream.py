"""The run's live stream on the real stack: uvicorn (ASGI) on the test database, Redis pub/sub.

A producer thread posts events to /api/runs/<id>/events/ with the run's bearer token, as the engine
does, while a client reads /api/runs/<id>/stream/ as EventSource would: the server ends every stream
after 2 s (POSTTRAIN_SSE_MAX_STREAM_S), the client also drops some connections itself mid-stream, and
each time it reconnects with Last-Event-ID. In the end it must have had every event exactly once, in order.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import requests

from tests.support.stack import UvicornServer, postgres_url
from tests.unit.platform.helpers import join

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "a-long-test-passphrase"
EVENTS = 120  # about 6 s of posting at 20 events/s: three server-side drops at least
DEADLINE_S = 120


@pytest.fixture
def web(tmp_path) -> Iterator[UvicornServer]:
    from django.conf import settings
    from django.db import connection

    redis_url = os.environ.get("REDIS_URL")
    if not redis_url:
        pytest.fail("this test needs REDIS_URL (a real Redis); run it with `make test`")
    env = {
        **os.environ,
        "DATABASE_URL": postgres_url(connection.settings_dict),
        "POSTTRAIN_HOME": str(tmp_path / "home"),
        "POSTTRAIN_SECRET_KEY": settings.SECRET_KEY,  # the server checks the tokens this process derives
        "REDIS_URL": redis_url,
        "POSTTRAIN_SSE_MAX_STREAM_S": "2",
        "POSTTRAIN_SSE_KEEPALIVE_S": "1",
        "PYTHONUNBUFFERED": "1",
    }
    server = UvicornServer(env, tmp_path / "uvicorn.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def a_running_run():
    from posttrain.accounts.services import user_create
    from posttrain.core.run_tokens import ingest_token, token_hash
    from posttrain.runs.models import Run
    from tests.unit.platform.helpers import a_reward_row, an_experiment

    join(user_create("stream-reader", PASSWORD, "researcher"), "maintainer")
    run_id = uuid.uuid4()
    Run.objects.create(
        id=run_id,
        experiment=an_experiment(rewards=[a_reward_row()]),
        state="starting",
        ingest_token_hash=token_hash(ingest_token(run_id)),
    )
    return run_id, ingest_token(run_id)


def signed_in(base: str) -> requests.Session:
    session = requests.Session()
    session.get(f"{base}/login/", timeout=30)
    response = session.post(
        f"{base}/login/",
        timeout=30,
        allow_redirects=False,
        data={"username": "stream-reader", "password": PASSWORD, "csrfmiddlewaretoken": session.cookies["csrftoken"]},
    )
    assert response.status_code == 302, response.text[:500]
    return session


def the_engine_history(run_id: uuid.UUID) -> list[dict]:
    """status running, then metrics every step with a log every 5th and a heartbeat every 7th, then succeeded."""
    events: list[dict] = []

    def add(kind: str, step: int | None, data: dict) -> None:
        events.append(
            {"run": str(run_id), "seq": len(events) + 1, "type": kind, "step": step, "time": time.time(), "data": data}
        )

    add("status", None, {"state": "running"})
    step = 0
    while len(events) < EVENTS:
        step += 1
        add("metrics", step, {"reward/mean": step / 100, "kl/mean": "nan" if step == 3 else 0.01})
        if step % 5 == 0:
            add("log", step, {"level": "info", "message": f"step {step} done"})
        if step % 7 == 0:
            add("heartbeat", step, {})
    add("status", step, {"state": "succeeded"})
    return events


def post_like_the_engine(base: str, run_id: uuid.UUID, token: str, events: list[dict], failures: list[str]) -> None:
    """Batches of 1 to 3 events, about 20 events a second."""
    with requests.Session() as session:
        session.headers["Authorization"] = f"Bearer {token}"
        i = 0
        while i < len(events):
            batch = events[i : i + 1 + i % 3]
            response = session.post(f"{base}/api/runs/{run_id}/events/", json={"events": batch}, timeout=30)
            if response.status_code != 200:
                failures.append(f"{response.status_code} {response.text[:300]}")
                return
            i += len(batch)
            time.sleep(0.05 * len(batch))


@dataclass
class Client:
    """An EventSource: reads messages, remembers the last id, reconnects with Last-Event-ID."""

    session: requests.Session
    url: str
    last_id: str | None = None
    seqs: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    connections: int = 0
    dropped_by_us: int = 0
    ended: bool = False

    def connect_once(self, drop_after: int | None) -> None:
        headers = {"Accept": "text/event-stream"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = self.last_id
        self.connections += 1
        with self.session.get(self.url, headers=headers, stream=True, timeout=30) as response:
            assert response.status_code == 200, response.text[:500]
            read_here = 0
            for message in sse_messages(response):
                if "id" in message:
                    self.last_id = message["id"]
                if "event" not in message:
                    continue
                self.kinds.append(message["event"])
                if message["event"] == "end":
                    self.ended = True
                    return
                data = json.loads(message["data"])
                if "seq" in data:
                    assert str(data["seq"]) == message["id"]
                    self.seqs.append(data["seq"])
                    read_here += 1
                if drop_after is not None and read_here >= drop_after:
                    self.dropped_by_us += 1
                    return  # leaving the `with` closes the socket mid-stream


def sse_messages(response: requests.Response) -> Iterator[dict[str, str]]:
    buffer = ""
    for chunk in response.iter_content(chunk_size=None):
        buffer += chunk.decode()
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            fields = {}
            for line in block.split("\n"):
                if line and not line.startswith(":"):
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")
            if fields:
                yield fields


def test_the_stream_resumes_after_dropped_connections_without_losing_or_repeating_events(web):
    run_id, token = a_running_run()
    history = the_engine_history(run_id)
    client = Client(signed_in(web.url), f"{web.url}/api/runs/{run_id}/stream/?last_event_id=0")
    failures: list[str] = []
    producer = threading.Thread(target=post_like_the_engine, args=(web.url, run_id, token, history, failures))
    producer.start()
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not client.ended and time.monotonic() < deadline:
            # Every third connection the client drops itself after a few messages; the others last
            # until the server ends them (2 s) or the run ends.
            client.connect_once(drop_after=4 if client.connections % 3 == 2 else None)
    finally:
        producer.join(timeout=DEADLINE_S)
    assert not failures, failures
    assert client.ended, f"no `end` within {DEADLINE_S}s; got {len(client.seqs)} events"
    streamed = [e["seq"] for e in history if e["type"] in ("metrics", "log")]
    assert client.seqs == streamed  # each once, in order
    assert client.connections - client.dropped_by_us >= 3  # the server ended at least two streams, then `end`
    assert client.dropped_by_us >= 1
    assert client.kinds[-2:] == ["state", "end"]
    log = web.log()
    assert "Traceback" not in log and '" 500' not in log, log[-3000:]
