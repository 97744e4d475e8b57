"""The event sender against a real local HTTP server speaking the platform's protocol
(stores each seq once, 409 with expected_seq on a gap), which can drop connections or fail for a while."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from posttrain_sdk.event_log import EventLog
from posttrain_sdk.event_sender import EventSender, ingest_token_from_env, sender_from_env

TOKEN = "secret-token"


class Platform:
    """In-memory stand-in for POST /api/runs/<id>/events."""

    def __init__(self) -> None:
        self.stored: list[int] = []
        self.batches: list[int] = []  # size of each request's batch
        self.lock = threading.Lock()
        self.drop_connections = False
        self.fail_with: int | None = None
        self.fail_next = 0
        self.upload_answer: tuple[int, dict] = (201, {})  # PUT .../rollouts/<name>/upload

    @property
    def last_seq(self) -> int:
        return self.stored[-1] if self.stored else 0

    def handle(self, handler: BaseHTTPRequestHandler) -> tuple[int, dict] | None:
        with self.lock:
            if self.drop_connections:
                return None
            body = handler.rfile.read(int(handler.headers["Content-Length"]))
            if self.fail_next > 0:
                self.fail_next -= 1
                return 503, {"detail": "restarting"}
            if handler.headers.get("Authorization") != f"Bearer {TOKEN}":
                return 403, {"detail": "this token is not valid for this run"}
            if self.fail_with is not None:
                return self.fail_with, {"detail": "refused"}
            events = json.loads(body)["events"]
            self.batches.append(len(events))
            new = [e["seq"] for e in events if e["seq"] > self.last_seq]
            expected = self.last_seq + 1
            if new != list(range(expected, expected + len(new))):
                return 409, {"expected_seq": expected}
            self.stored.extend(new)
            return 200, {"acknowledged_seq": self.last_seq, "stored": len(new)}


@pytest.fixture
def platform():
    state = Platform()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            answer = state.handle(self)
            if answer is None:  # the server goes away mid-request: no status line at all
                self.close_connection = True
                return
            self.answer(*answer)

        def do_PUT(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.answer(*state.upload_answer)

        def answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_port}/api/runs/r/events"
    yield state
    server.shutdown()
    server.server_close()


def write_events(path: Path, first: int, last: int, payload: str = "") -> None:
    with path.open("a") as f:
        for seq in range(first, last + 1):
            f.write(
                json.dumps(
                    {
                        "run": "r",
                        "seq": seq,
                        "type": "log",
                        "step": None,
                        "time": 1.0,
                        "data": {"message": f"event {seq}{payload}"},
                    }
                )
                + "\n"
            )


def sender_for(path: Path, platform: Platform, **kwargs) -> EventSender:
    kwargs.setdefault("max_backoff_s", 0.2)
    kwargs.setdefault("initial_backoff_s", 0.02)
    kwargs.setdefault("poll_interval_s", 0.05)
    return EventSender(path, platform.url, TOKEN, **kwargs).start()


def test_every_event_is_shipped_once_in_order_in_bounded_batches(tmp_path, platform):
    path = tmp_path / "events.jsonl"
    write_events(path, 1, 1200)
    sender = sender_for(path, platform, batch_size=500)
    try:
        assert sender.flush(timeout_s=30)
    finally:
        sender.close()
    assert platform.stored == list(range(1, 1201))
    assert max(platform.batches) == 500 and sender.acknowledged_seq == 1200


def test_batches_also_respect_the_byte_limit(tmp_path, platform):
    path = tmp_path / "events.jsonl"
    write_events(path, 1, 10, payload="x" * 1000)
    sender = sender_for(path, platform, max_batch_bytes=3000)
    try:
        assert sender.flush(timeout_s=30)
    finally:
        sender.close()
    assert platform.stored == list(range(1, 11)) and max(platform.batches) <= 3


def test_events_written_during_an_outage_are_all_delivered_afterwards_without_gaps_or_duplicates(tmp_path, platform):
    path = tmp_path / "events.jsonl"
    write_events(path, 1, 20)
    sender = sender_for(path, platform, batch_size=7)
    try:
        assert sender.flush(timeout_s=30)
        platform.drop_connections = True  # the web server goes away
        for first in range(21, 121, 10):  # the run keeps writing
            write_events(path, first, first + 9)
            sender.wake()
            time.sleep(0.1)
        assert not sender.flush(timeout_s=0.3)  # nothing can be acknowledged now
        assert sender.retries > 0 and sender.last_failure
        platform.drop_connections = False  # it is back
        assert sender.flush(timeout_s=30)
    finally:
        sender.close()
    assert platform.stored == list(range(1, 121))


def test_server_errors_are_retried_with_backoff(tmp_path, platform):
    path = tmp_path / "events.jsonl"
    write_events(path, 1, 5)
    platform.fail_next = 4
    sender = sender_for(path, platform)
    try:
        assert sender.flush(timeout_s=30)
    finally:
        sender.close()
    assert platform.stored == [1, 2, 3, 4, 5] and sender.retries == 4 and "503" in sender.last_failure


def test_a_restarted_shipper_continues_after_what_the_platform_already_has(tmp_path, platform):
    path = tmp_path / "events.jsonl"
    write_events(path, 1, 80)
    platform.stored = list(range(1, 51))  # an earlier sender delivered these before the engine restarted
    sender = sender_for(path, platform, batch_size=20)
    try:
        assert sender.flush(timeout_s=30)
    finally:
        sender.close()
    assert platform.stored == list(range(1, 81))


def test_a_409_reseeks_the_file_to_the_expected_seq(tmp_path, platform):
    path = tmp_path / "events.jsonl"
    write_events(path, 1, 20)
    sender = sender_for(path, platform, batch_size=5)
    try:
        assert sender.flush(timeout_s=30)
        with platform.lock:
            platform.stored = list(range(1, 11))  # the platform lost 11..20 (a restored database)
        write_events(path, 21, 30)
        sender.wake()
        assert sender.flush(timeout_s=30)
    finally:
        sender.close()
    assert platform.stored == list(range(1, 31))


def test_a_refused_token_stops_shipping_and_says_why(tmp_path, platform):
    path = tmp_path / "events.jsonl"
    write_events(path, 1, 3)
    sender = EventSender(path, platform.url, "wrong", poll_interval_s=0.05).start()
    try:
        assert not sender.flush(timeout_s=10)
    finally:
        sender.close()
    assert "HTTP 403" in sender.error and platform.stored == []


def test_finish_gives_up_after_its_timeout_when_the_platform_stays_down(tmp_path, platform, capsys):
    path = tmp_path / "events.jsonl"
    write_events(path, 1, 3)
    platform.drop_connections = True
    sender = sender_for(path, platform)
    started = time.monotonic()
    assert sender.finish(timeout_s=0.5) is False
    assert time.monotonic() - started < 10
    assert "events 1..3 were not delivered" in capsys.readouterr().err


def test_a_partly_written_last_line_waits_until_it_is_complete(tmp_path, platform):
    path = tmp_path / "events.jsonl"
    write_events(path, 1, 2)
    line = json.dumps({"run": "r", "seq": 3, "type": "log", "step": None, "time": 1.0, "data": {"message": "x"}})
    with path.open("a") as f:
        f.write(line[:10])
    sender = sender_for(path, platform)
    try:
        assert sender.flush(timeout_s=30)  # everything complete so far
        assert platform.stored == [1, 2]
        with path.open("a") as f:
            f.write(line[10:] + "\n")
        sender.wake()
        assert sender.flush(timeout_s=30)
    finally:
        sender.close()
    assert platform.stored == [1, 2, 3]


def test_from_env_ships_a_sinks_events_and_is_off_without_a_url(tmp_path, platform, monkeypatch):
    monkeypatch.delenv("POSTTRAIN_EVENTS_URL", raising=False)
    sink = EventLog(tmp_path / "a", "r")
    assert sender_from_env(sink) is None
    monkeypatch.setenv("POSTTRAIN_EVENTS_URL", platform.url)
    monkeypatch.setenv("POSTTRAIN_INGEST_TOKEN", TOKEN)
    sink = EventLog(tmp_path / "b", "r")
    sender = sender_from_env(sink)
    for step in range(5):
        sink.emit("metrics", {"reward/mean": 0.1 * step}, step=step)
    sink.close()
    assert sender.finish(timeout_s=30)
    assert platform.stored == [1, 2, 3, 4, 5]


def test_the_token_is_read_once_from_its_file_which_is_then_deleted(tmp_path, monkeypatch):
    token_file = tmp_path / "ingest_token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    monkeypatch.setenv("POSTTRAIN_INGEST_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("POSTTRAIN_INGEST_TOKEN", "not-this-one")
    assert ingest_token_from_env() == TOKEN
    assert not token_file.exists()
    with pytest.raises(RuntimeError, match="cannot read the run's ingestion token from .*restart the run"):
        ingest_token_from_env()


def test_without_a_token_file_the_token_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("POSTTRAIN_INGEST_TOKEN_FILE", raising=False)
    monkeypatch.setenv("POSTTRAIN_INGEST_TOKEN", TOKEN)
    assert ingest_token_from_env() == TOKEN


@pytest.mark.parametrize(
    "loc, refused",
    [("name", False), ("", True)],  # a file the platform announced already; a run that ended
)
def test_an_upload_answered_409_is_held_when_the_file_is_announced_and_refused_otherwise(
    tmp_path, platform, loc, refused
):
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "step_00000001.parquet").write_bytes(b"PAR1 rows PAR1")
    path = tmp_path / "events.jsonl"
    samples = {"run": "r", "seq": 1, "type": "samples", "step": 1, "time": 1.0}
    path.write_text(json.dumps({**samples, "data": {"file": "step_00000001.parquet", "upload": True}}) + "\n")
    platform.upload_answer = (409, {"errors": [{"loc": loc, "msg": "no"}]})
    sender = sender_for(path, platform)
    try:
        assert sender.flush(timeout_s=30)
    finally:
        sender.close()
    assert platform.stored == [1]  # the event goes out either way
    assert ("step_00000001.parquet" in sender.refused_files) is refused
