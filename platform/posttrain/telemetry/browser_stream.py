"""The browser stream: a run's Server-Sent Events, where stored rows and live events become the same
messages. Served by posttrain.telemetry.api.stream, read by frontend/static/js/browser_stream_client.js;
the last server-side hop of the event path (docs/ARCHITECTURE.md, "The event path").

Messages (`event: <kind>`, `data: <one JSON line>`):

    metrics     id: seq   {"seq", "step", "time", "values"}          non-finite values as null
    samples     id: seq   {"seq", "step", "count"}                   a step's rollout file arrived: the page
                                                                     re-reads its table over the REST API
    log         id: seq   {"seq", "step", "time", "level", "message"}
    checkpoint  id: seq   {"seq", "step", "path"}
    state       no id     {"state", "reason", "last_step"}           at connect and whenever it changes
    end         no id     {}                                         the run ended and everything stored was sent

Heartbeat and status events are not messages (a status change reaches the page as `state`).

No gap and no duplicate (`run_stream`): subscribe to the run's live channel first, then replay the
stored rows with seq in (resume point, run.last_seq], then forward live batches, dropping whatever is
already covered. The replay stops at `last_seq` because events are stored contiguously and `last_seq`
moves in the transaction that stores them: every row up to it is readable, whatever the tables' read
order, and everything after it is committed (hence published) after the subscription. A live batch
that does not continue where the stream stands (a subscriber that overflowed, batches published out
of commit order) is filled in from the store first.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connection

from posttrain.runs.models import TERMINAL_STATES, Checkpoint, Run
from posttrain.telemetry import live_channel
from posttrain.telemetry.event_schema import finite_or_none
from posttrain.telemetry.models import MetricRow, RolloutFile, RunLog

logger = logging.getLogger(__name__)

RETRY = b"retry: 1000\n\n"  # EventSource reconnects 1 s after a drop, sending Last-Event-ID
KEEPALIVE = b": keep-alive\n\n"
REPLAY_WINDOW = 2000  # seqs per replay read: a long run replays in bounded memory
_MIN_WAIT_S = 0.05
# Waiting for a live batch blocks a thread (a queue or a Redis socket). Streams wait in their own pool:
# the event loop's default one has min(32, cpus + 4) threads, which a few open run pages would fill,
# stalling every other `to_thread` call of the process.
_WAIT_POOL = ThreadPoolExecutor(max_workers=256, thread_name_prefix="run-stream-wait")

T = TypeVar("T")


@dataclass(frozen=True)
class Message:
    kind: str
    data: dict[str, Any]
    seq: int | None = None

    def encode(self) -> bytes:
        # json.dumps escapes newlines, so `data` is one line as SSE needs.
        data = json.dumps(self.data, separators=(",", ":"), allow_nan=False)
        head = f"id: {self.seq}\n" if self.seq is not None else ""
        return f"{head}event: {self.kind}\ndata: {data}\n\n".encode()


END = Message("end", {})


def metrics_message(seq: int, step: int, time_s: float, values: dict[str, Any]) -> Message:
    data = {"seq": seq, "step": step, "time": time_s, "values": {k: finite_or_none(v) for k, v in values.items()}}
    return Message("metrics", data, seq)


def samples_message(seq: int, step: int, count: int) -> Message:
    return Message("samples", {"seq": seq, "step": step, "count": count}, seq)


def log_message(seq: int, step: int | None, time_s: float, level: str, message: str) -> Message:
    return Message("log", {"seq": seq, "step": step, "time": time_s, "level": level, "message": message}, seq)


def checkpoint_message(seq: int, step: int, path: str) -> Message:
    return Message("checkpoint", {"seq": seq, "step": step, "path": path}, seq)


def event_message(event: dict[str, Any]) -> Message | None:
    """The message of one engine event as published on the live channel (validated, as stored)."""
    kind, data, seq = event["type"], event["data"], event["seq"]
    # Metrics, samples and checkpoint events have their step (event_schema requires it); a log's is optional.
    if kind == "metrics":
        return metrics_message(seq, event["step"], event["time"], data)
    if kind == "samples":
        return samples_message(seq, event["step"], data["rows"])
    if kind == "checkpoint":
        return checkpoint_message(seq, event["step"], data["path"])
    if kind == "log":
        return log_message(seq, event.get("step"), event["time"], data.get("level", "info"), data["message"])
    return None  # heartbeat, status


def stored_messages(run_id: uuid.UUID | str, after: int, upto: int) -> list[Message]:
    """The messages of the stored rows with after < seq <= upto, in seq order (samples: one per event)."""
    window = {"run_id": run_id, "seq__gt": after, "seq__lte": upto}
    rows = MetricRow.objects.filter(**window).values_list("seq", "step", "time", "values")
    messages = [metrics_message(*row) for row in rows]
    files = RolloutFile.objects.filter(**window).values_list("seq", "step", "rows")
    messages += [samples_message(*row) for row in files]
    messages += [
        checkpoint_message(*row) for row in Checkpoint.objects.filter(**window).values_list("seq", "step", "path")
    ]
    logs = RunLog.objects.filter(**window).values_list("seq", "step", "time", "level", "message")
    messages += [log_message(*row) for row in logs]
    return sorted(messages, key=_stored_seq)


def _stored_seq(message: Message) -> int:
    assert message.seq is not None  # a stored row's message carries the row's seq (the builders above)
    return message.seq


@dataclass(frozen=True)
class RunPoint:
    """Where a run stands: its state, and how far its stored events go."""

    state: str
    reason: str
    last_step: int | None
    last_seq: int

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL_STATES

    def message(self) -> Message:
        return Message("state", {"state": self.state, "reason": self.reason, "last_step": self.last_step})


def run_point(run_id: uuid.UUID | str) -> RunPoint | None:
    row = Run.objects.filter(pk=run_id).values_list("state", "state_reason", "last_step", "last_seq").first()
    return None if row is None else RunPoint(*row)


def _read(function: Callable[..., T]) -> Callable[..., Any]:
    """`function` as an awaitable database read that gives its connection back afterwards: a stream
    lives for minutes, mostly waiting, and must not hold a Postgres connection meanwhile."""

    def read_and_release(*args: Any) -> T:
        try:
            return function(*args)
        finally:
            if not connection.in_atomic_block:  # (a test's transaction keeps its connection)
                connection.close()

    return sync_to_async(read_and_release)


class _Stream:
    """One client's stream of one run; `position` is the highest seq it has covered (sent or skipped)."""

    def __init__(self, run_id: uuid.UUID | str, after: int, subscription: live_channel.Subscription):
        self.run_id = run_id
        self.position = after
        self.subscription = subscription
        self.sent_state: tuple[str, str] | None = None
        self.ended = False
        self._waiting: Future | None = None

    async def next_batch(self, timeout: float) -> list[dict[str, Any]] | None:
        self._waiting = _WAIT_POOL.submit(self.subscription.get, max(timeout, _MIN_WAIT_S))
        return await asyncio.wrap_future(self._waiting)

    def close(self) -> None:
        # A wait still running in its thread (the client left meanwhile) closes the subscription when
        # it returns: closing a Redis connection under a reading thread is not safe.
        if self._waiting is None or self._waiting.done():
            self.subscription.close()
        else:
            self._waiting.add_done_callback(lambda _: self.subscription.close())

    async def catch_up(self, upto: int) -> AsyncIterator[bytes]:
        """The stored events after `position` up to `upto`, in seq order."""
        while self.position < upto:
            window_end = min(upto, self.position + REPLAY_WINDOW)
            for message in await _read(stored_messages)(self.run_id, self.position, window_end):
                yield message.encode()
            self.position = window_end

    async def state_change(self, point: RunPoint | None = None) -> AsyncIterator[bytes]:
        """The run's state if it changed; for a run that ended, everything stored first, then `end`."""
        point = point or await _read(run_point)(self.run_id)
        if point is None:  # the run was deleted
            self.ended = True
            return
        if point.ended:
            async for chunk in self.catch_up(point.last_seq):
                yield chunk
        if (point.state, point.reason) != self.sent_state:
            self.sent_state = (point.state, point.reason)
            yield point.message().encode()
        if point.ended:
            self.ended = True
            yield END.encode()

    async def forward(self, batch: list[dict[str, Any]]) -> AsyncIterator[bytes]:
        events = sorted((e for e in batch if isinstance(e.get("seq"), int)), key=lambda e: e["seq"])
        fresh = [e for e in events if e["seq"] > self.position]
        if self.subscription.overflowed or (fresh and fresh[0]["seq"] != self.position + 1):
            self.subscription.overflowed = False  # reset before reading: a later overflow is seen next time
            point = await _read(run_point)(self.run_id)
            if point is not None:
                async for chunk in self.catch_up(point.last_seq):
                    yield chunk
        for event in events:
            if event["seq"] <= self.position:
                continue
            message = event_message(event)
            if message is not None:
                yield message.encode()
            self.position = event["seq"]
        if len(events) < len(batch):  # a state item (services.run_transition) came with it
            async for chunk in self.state_change():
                yield chunk


async def run_stream(run_id: uuid.UUID | str, after: int, *, keepalive_s: float, max_s: float) -> AsyncIterator[bytes]:
    """The SSE byte stream of a run from seq `after` on. It ends after `end` (the run ended and all
    was sent) or after `max_s` seconds, when EventSource reconnects by itself with Last-Event-ID."""
    deadline = time.monotonic() + max_s
    try:
        subscription = await asyncio.to_thread(live_channel.subscribe, run_id)  # Redis confirms over the network
    except Exception:
        logger.warning("cannot subscribe to the live channel of run %s; the client will retry", run_id, exc_info=True)
        yield RETRY
        return
    stream = _Stream(run_id, after, subscription)
    try:
        yield RETRY
        point = await _read(run_point)(run_id)
        if point is None:
            return
        stream.sent_state = (point.state, point.reason)
        yield point.message().encode()
        async for chunk in stream.catch_up(point.last_seq):
            yield chunk
        if point.ended:
            yield END.encode()
            return
        async for chunk in _live(stream, deadline, keepalive_s):
            yield chunk
    finally:
        stream.close()


async def _live(stream: _Stream, deadline: float, keepalive_s: float) -> AsyncIterator[bytes]:
    """What the live channel brings, with a keep-alive every `keepalive_s`, until the run ended and all
    was sent or the `deadline` (time.monotonic) passed."""
    next_keepalive = time.monotonic() + keepalive_s
    while not stream.ended and (now := time.monotonic()) < deadline:
        batch = await stream.next_batch(min(next_keepalive, deadline) - now)
        if batch is not None:
            async for chunk in stream.forward(batch):
                yield chunk
        elif stream.subscription.overflowed:
            async for chunk in stream.forward([]):
                yield chunk
        if not stream.ended and time.monotonic() >= next_keepalive:
            yield KEEPALIVE
            next_keepalive = time.monotonic() + keepalive_s
            # A state item lost on the way (a Redis hiccup) must not leave the page waiting.
            async for chunk in stream.state_change():
                yield chunk
