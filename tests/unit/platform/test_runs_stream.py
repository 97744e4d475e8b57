"""The run page's live stream: GET /api/runs/<id>/stream/ (Server-Sent Events).

The view is async; each test drives it with Django's AsyncClient inside one `async_to_sync` call, so
the stream's database reads (thread-sensitive `sync_to_async`) run on this test's thread and see its
transaction. Events are stored through `posttrain.telemetry.ingestion.events_ingest` with on-commit callbacks executed,
so they are published on the live channel exactly as the ingestion endpoint publishes them.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import AsyncClient

from posttrain.runs import services
from posttrain.runs.models import Run, RunState
from posttrain.telemetry import browser_stream, live_channel
from posttrain.telemetry.event_schema import parse_batch
from posttrain.telemetry.ingestion import events_ingest
from tests.unit.platform.helpers import event, make_run, sample_record, samples_event

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]
S = RunState
READ_TIMEOUT_S = 20  # a broken stream fails the test instead of hanging it


@pytest.fixture(autouse=True)
def short_streams(settings):
    settings.PUBSUB_BACKEND = "inprocess"
    settings.SSE_KEEPALIVE_S = 15
    settings.SSE_MAX_STREAM_S = 30


@pytest.fixture(params=["inprocess", "redis"])
def backend(request, settings) -> str:
    if request.param == "redis":
        url = os.environ.get("REDIS_URL")
        if not url:
            pytest.fail("the Redis backend test needs REDIS_URL (a real Redis); run it with `make test`")
        settings.REDIS_URL = url
    settings.PUBSUB_BACKEND = request.param
    return request.param


@pytest.fixture
def client(researcher) -> AsyncClient:
    client = AsyncClient()
    client.force_login(researcher)
    return client


@pytest.fixture
def store(django_capture_on_commit_callbacks) -> Callable[[Run, list[dict]], None]:
    """store(run, events): ingested as the endpoint does, on-commit publishing included."""

    def ingest(run: Run, events: list[dict]) -> None:
        with django_capture_on_commit_callbacks(execute=True):
            events_ingest(run.pk, parse_batch({"events": events}, str(run.pk)))

    return ingest


@pytest.fixture
def transition(django_capture_on_commit_callbacks) -> Callable[..., None]:
    def move(run: Run, from_states: list[str], to_state: str, reason: str) -> None:
        with django_capture_on_commit_callbacks(execute=True):
            assert services.run_transition(run.pk, from_states, to_state, reason)

    return move


def a_run_history(run: Run) -> list[dict]:
    """Seq 1..9: every event type, a non-finite metric and a samples event of three samples."""
    return [
        event(run, 1, "status", None, {"state": "running"}),
        event(run, 2, "log", 0, {"level": "info", "message": "policy loaded\nsecond line"}),
        event(run, 3, "metrics", 1, {"reward/mean": 0.25, "kl/mean": "nan", "policy/entropy": 2}),
        samples_event(run, 4, 1, [sample_record(i) for i in range(3)]),
        event(run, 5, "heartbeat", 1),
        event(run, 6, "metrics", 2, {"reward/mean": 0.5, "kl/mean": "inf", "policy/entropy": 1.5}),
        event(run, 7, "checkpoint", 2, {"path": "/storage/runs/x/checkpoints/step_2"}),
        event(run, 8, "log", None, {"level": "warning", "message": "slow step"}),
        samples_event(run, 9, 2, [sample_record(i) for i in range(2)]),
    ]


def expected(history: list[dict], after: int = 0) -> list[tuple[int, str, dict]]:
    """The (id, kind, data) messages the history must stream as, written out by hand per type."""
    out = []
    for e in history:
        seq, step, data = e["seq"], e["step"], e["data"]
        if seq <= after:
            continue
        if e["type"] == "metrics":
            values = {k: (None if isinstance(v, str) else v) for k, v in data.items()}
            out.append((seq, "metrics", {"seq": seq, "step": step, "time": e["time"], "values": values}))
        elif e["type"] == "samples":
            out.append((seq, "samples", {"seq": seq, "step": step, "count": data["rows"]}))
        elif e["type"] == "checkpoint":
            out.append((seq, "checkpoint", {"seq": seq, "step": step, "path": data["path"]}))
        elif e["type"] == "log":
            out.append(
                (
                    seq,
                    "log",
                    {"seq": seq, "step": step, "time": e["time"], "level": data["level"], "message": data["message"]},
                )
            )
    return out


@dataclass
class Message:
    id: int | None
    kind: str
    data: dict[str, Any]


@dataclass
class Reader:
    """Reads an SSE response as EventSource would: messages, comments and the retry field."""

    chunks: Any
    messages: list[Message] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    retry: list[int] = field(default_factory=list)
    finished: bool = False
    _buffer: str = ""

    async def read_until(self, done: Callable[[list[Message]], bool]) -> None:
        async def pump() -> None:
            while not done(self.messages):
                try:
                    chunk = await anext(self.chunks)
                except StopAsyncIteration:
                    self.finished = True
                    return
                self._feed(chunk.decode())

        await asyncio.wait_for(pump(), READ_TIMEOUT_S)

    async def read_to_end(self) -> None:
        await self.read_until(lambda _: False)
        assert self.finished

    def _feed(self, text: str) -> None:
        self._buffer += text
        while "\n\n" in self._buffer:
            block, self._buffer = self._buffer.split("\n\n", 1)
            fields: dict[str, str] = {}
            for line in block.split("\n"):
                if line.startswith(":"):
                    self.comments.append(line[1:].strip())
                    continue
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
            if "retry" in fields:
                self.retry.append(int(fields["retry"]))
            if "event" in fields:
                msg_id = int(fields["id"]) if "id" in fields else None
                self.messages.append(Message(msg_id, fields["event"], json.loads(fields["data"])))

    def seq_messages(self) -> list[tuple[int, str, dict]]:
        return [(m.id, m.kind, m.data) for m in self.messages if m.id is not None]

    def kinds(self) -> list[str]:
        return [m.kind for m in self.messages]


async def open_stream(client: AsyncClient, run: Run, query: str = "", **headers: str) -> Reader:
    response = await client.get(f"/api/runs/{run.pk}/stream/{query}", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "text/event-stream"
    assert (response["Cache-Control"], response["X-Accel-Buffering"]) == ("no-cache", "no")
    return Reader(aiter(response.streaming_content))


def read_whole_stream(client: AsyncClient, run: Run, query: str = "", **headers: str) -> Reader:
    async def scenario() -> Reader:
        reader = await open_stream(client, run, query, **headers)
        await reader.read_to_end()
        return reader

    return async_to_sync(scenario)()


@pytest.fixture
def finished_run(experiment, store, transition) -> tuple[Run, list[dict]]:
    run = make_run(experiment, S.STARTING)
    history = a_run_history(run)
    store(run, history)
    transition(run, [S.RUNNING], S.SUCCEEDED, "engine finished every step")
    return run, history


# --- replay ------------------------------------------------------------------------------------


def test_replay_after_last_event_id_is_exactly_the_stored_events_after_it_in_seq_order(client, finished_run):
    run, history = finished_run
    reader = read_whole_stream(client, run, **{"Last-Event-ID": "3"})
    assert reader.seq_messages() == expected(history, after=3)
    assert [m[0] for m in reader.seq_messages()] == [4, 6, 7, 8, 9]


def test_a_finished_run_streams_retry_state_everything_stored_then_end(client, finished_run):
    run, history = finished_run
    reader = read_whole_stream(client, run)
    assert reader.retry == [1000]
    assert reader.messages[0] == Message(
        None, "state", {"state": "succeeded", "reason": "engine finished every step", "last_step": 2}
    )
    assert reader.seq_messages() == expected(history)
    assert reader.kinds()[-1] == "end" and reader.messages[-1] == Message(None, "end", {})


def test_samples_come_as_one_message_per_event_with_their_count(client, finished_run):
    run, _ = finished_run
    samples = [m for m in read_whole_stream(client, run).messages if m.kind == "samples"]
    assert samples == [
        Message(4, "samples", {"seq": 4, "step": 1, "count": 3}),
        Message(9, "samples", {"seq": 9, "step": 2, "count": 2}),
    ]


def test_the_query_parameter_is_the_resume_point_and_the_header_wins_over_it(client, finished_run):
    run, history = finished_run
    from_query = read_whole_stream(client, run, "?last_event_id=6")
    assert [m[0] for m in from_query.seq_messages()] == [7, 8, 9]
    from_header = read_whole_stream(client, run, "?last_event_id=2", **{"Last-Event-ID": "7"})
    assert from_header.seq_messages() == expected(history, after=7)


def test_stored_rows_and_live_events_make_identical_messages(experiment, store, settings):
    run = make_run(experiment, S.RUNNING)
    history = a_run_history(run)  # its status event changes nothing: the run is running already
    with live_channel.subscribe(run.pk) as subscription:
        store(run, history)
        published = subscription.get(timeout=5)
    live_messages = [m for m in map(browser_stream.event_message, published) if m is not None]
    assert live_messages == browser_stream.stored_messages(run.pk, 0, 9)
    assert [(m.seq, m.kind, m.data) for m in live_messages] == expected(history)


# --- live ----------------------------------------------------------------------------------------


def test_live_events_published_during_the_replay_are_neither_lost_nor_repeated(
    backend, client, experiment, store, transition
):
    run = make_run(experiment, S.STARTING)
    history = a_run_history(run)
    store(run, history[:5])  # seq 1..5 stored before the client connects
    later = [
        event(run, 10, "metrics", 3, {"reward/mean": 0.75}),
        event(run, 11, "log", 3, {"level": "info", "message": "step 3"}),
        event(run, 12, "metrics", 4, {"reward/mean": 1.0}),
    ]

    async def scenario() -> Reader:
        reader = await open_stream(client, run, "?last_event_id=1")
        # The first replayed message: the stream is subscribed and has read the store up to seq 5.
        await reader.read_until(lambda ms: any(m.id is not None for m in ms))
        # A batch committed before that read but published only now (the race the seq check covers) ...
        await sync_to_async(live_channel.publish)(run.pk, history[2:5])
        # ... and new batches stored and published while the replay is still being sent.
        await sync_to_async(store)(run, history[5:])
        await sync_to_async(store)(run, later)
        await reader.read_until(lambda ms: any(m.id == 12 for m in ms))
        await sync_to_async(transition)(run, [S.RUNNING], S.SUCCEEDED, "done")
        await reader.read_to_end()
        return reader

    reader = async_to_sync(scenario)()
    assert reader.seq_messages() == expected(history + later, after=1)
    assert reader.kinds()[-2:] == ["state", "end"]


def test_a_state_change_reaches_the_stream_and_a_final_one_ends_it(client, experiment, store, transition):
    run = make_run(experiment, S.STARTING)
    store(run, a_run_history(run)[:3])

    async def scenario() -> Reader:
        reader = await open_stream(client, run, "?last_event_id=3")
        await reader.read_until(lambda ms: len(ms) == 1)
        await sync_to_async(transition)(run, [S.RUNNING], S.CANCELLING, "cancel requested by ada")
        await reader.read_until(lambda ms: len(ms) == 2)
        await sync_to_async(transition)(run, [S.CANCELLING], S.CANCELLED, "cancelled")
        await reader.read_to_end()
        return reader

    reader = async_to_sync(scenario)()
    assert reader.messages == [
        Message(None, "state", {"state": "running", "reason": "engine started", "last_step": 1}),
        Message(None, "state", {"state": "cancelling", "reason": "cancel requested by ada", "last_step": 1}),
        Message(None, "state", {"state": "cancelled", "reason": "cancelled", "last_step": 1}),
        Message(None, "end", {}),
    ]


def test_events_that_overflow_the_subscription_are_read_from_the_store(client, experiment, store, monkeypatch):
    monkeypatch.setattr(live_channel, "MAX_PENDING", 2)  # the in-process queue of a new subscription holds 2 batches
    run = make_run(experiment, S.RUNNING)
    batches = [[event(run, seq, "metrics", seq, {"reward/mean": seq / 10})] for seq in range(1, 7)]

    async def scenario() -> Reader:
        reader = await open_stream(client, run)
        await reader.read_until(lambda ms: len(ms) == 1)  # state sent; nothing reads the queue now
        for batch in batches:
            await sync_to_async(store)(run, batch)
        await reader.read_until(lambda ms: any(m.id == 6 for m in ms))
        return reader

    reader = async_to_sync(scenario)()
    assert [m[0] for m in reader.seq_messages()] == [1, 2, 3, 4, 5, 6]


def test_a_quiet_stream_sends_keepalives_and_ends_after_its_maximum_duration(client, experiment, settings):
    settings.SSE_KEEPALIVE_S = 0.05
    settings.SSE_MAX_STREAM_S = 1.0
    run = make_run(experiment, S.RUNNING)
    reader = read_whole_stream(client, run)
    assert reader.kinds() == ["state"]  # no `end`: the run goes on, EventSource reconnects
    assert reader.comments and set(reader.comments) == {"keep-alive"}


def test_run_transition_publishes_the_change_on_the_live_channel_after_commit(
    experiment, django_capture_on_commit_callbacks
):
    run = make_run(experiment, S.RUNNING)
    with live_channel.subscribe(run.pk) as subscription:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            assert services.run_transition(run.pk, [S.RUNNING], S.CANCELLING, "cancel requested by ada")
        assert subscription.get(timeout=0.05) is None  # nothing before the commit
        for callback in callbacks:
            callback()
        assert subscription.get(timeout=2) == [
            {
                "type": "state",
                "run": str(run.pk),
                "from_state": "running",
                "state": "cancelling",
                "reason": "cancel requested by ada",
            }
        ]


# --- refusals ------------------------------------------------------------------------------------


def get(client: AsyncClient, url: str, **headers: str):
    return async_to_sync(client.get)(url, headers=headers)


def test_anonymous_users_are_refused_as_by_the_rest_of_the_api(finished_run):
    run, _ = finished_run
    response = get(AsyncClient(), f"/api/runs/{run.pk}/stream/")
    assert response.status_code == 403
    assert response.json() == {"errors": [{"loc": "", "msg": "Authentication credentials were not provided."}]}


def test_an_annotator_is_refused_with_their_role_named(finished_run, make_user):
    run, _ = finished_run
    client = AsyncClient()
    client.force_login(make_user("annotator"))
    response = get(client, f"/api/runs/{run.pk}/stream/")
    assert response.status_code == 403
    assert response.json() == {
        "errors": [{"loc": "", "msg": "Only researchers and admins may use this endpoint; your role is annotator."}]
    }


@pytest.mark.parametrize(
    ("query", "headers", "loc", "bad"),
    [
        ("?last_event_id=abc", {}, "last_event_id", "'abc'"),
        ("?last_event_id=-1", {}, "last_event_id", "'-1'"),
        ("?last_event_id=1.5", {}, "last_event_id", "'1.5'"),
        ("", {"Last-Event-ID": "9223372036854775808"}, "Last-Event-ID", "'9223372036854775808'"),
    ],
)
def test_a_bad_resume_point_is_a_400_naming_it(client, finished_run, query, headers, loc, bad):
    run, _ = finished_run
    response = get(client, f"/api/runs/{run.pk}/stream/{query}", **headers)
    assert response.status_code == 400
    assert response.json() == {
        "errors": [
            {"loc": loc, "msg": f"must be an event seq (an integer between 0 and 9223372036854775807), got {bad}"}
        ]
    }


def test_a_token_client_streams_the_runs_it_reads_and_no_other_projects(finished_run, make_user):
    from rest_framework.authtoken.models import Token

    from posttrain.projects.models import Project
    from tests.unit.platform.helpers import join

    run, _ = finished_run
    reader = make_user("researcher", "reader")  # a member of the run's project (the default one)
    outsider = join(make_user("researcher", "outsider"), "owner", Project.objects.create(name="elsewhere"))
    outsider.project_memberships.filter(project__name="default").delete()
    token = lambda user: f"Token {Token.objects.create(user=user).key}"  # noqa: E731
    assert get(AsyncClient(), f"/api/runs/{run.pk}/stream/", Authorization=token(reader)).status_code == 200
    hidden = get(AsyncClient(), f"/api/runs/{run.pk}/stream/", Authorization=token(outsider))
    assert hidden.status_code == 404


def test_the_stream_of_an_unknown_run_is_a_404(client):
    response = get(client, "/api/runs/6f1c1b2e-0000-4000-8000-000000000000/stream/")
    assert response.status_code == 404
    assert response.json() == {"errors": [{"loc": "", "msg": "No Run matches the given query."}]}


def test_only_get_is_served(client, finished_run):
    run, _ = finished_run
    response = async_to_sync(client.post)(f"/api/runs/{run.pk}/stream/", {})
    assert response.status_code == 405
