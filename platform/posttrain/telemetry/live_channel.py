"""The live channel of a run: each accepted event batch is published once, after its commit (by the
ingestion service, posttrain.telemetry.ingestion), for the browser stream (posttrain.telemetry.browser_stream)
to forward. One hop of the event path (docs/ARCHITECTURE.md, "The event path").

Two backends, chosen by `settings.PUBSUB_BACKEND`:

- "redis": Redis pub/sub on channel `run:<id>`, so every web process sees every batch, whichever
  process ingested it (production: N uvicorn workers).
- "inprocess" (the embedded default): a thread-safe registry of subscriber queues in this process;
  enough when one process serves both the engine's posts and the browsers.

    publish(run_id, events)               never raises: the events are already stored
    with subscribe(run_id) as sub:        subscribed when this returns (nothing published later is missed)
        batch = sub.get(timeout=15)       a list of events, or None on timeout
        batch = await sub.aget(timeout=15)  the same from async code (SSE views)

Delivery is best effort (pub/sub semantics): a subscriber that connects late or falls more than
`MAX_PENDING` batches behind misses batches and should re-read the stored events (`overflowed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
import time
from functools import lru_cache
from typing import Any

from django.conf import settings

logger = logging.getLogger(__name__)

MAX_PENDING = 1000
_SUBSCRIBE_TIMEOUT_S = 5.0


def channel(run_id: object) -> str:
    return f"run:{run_id}"


class Subscription:
    """One listener on one run's channel. Close it (or use `with`) when the stream ends."""

    overflowed = False

    def get(self, timeout: float | None = None) -> list[dict[str, Any]] | None:
        raise NotImplementedError

    async def aget(self, timeout: float | None = None) -> list[dict[str, Any]] | None:
        # A worker thread waits, so the event loop stays free for other streams.
        return await asyncio.to_thread(self.get, timeout)

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


# --- in-process ------------------------------------------------------------------------------


class _LocalSubscription(Subscription):
    def __init__(self, hub: _LocalHub, key: str):
        self._hub = hub
        self._key = key
        self._queue: queue.Queue[list[dict[str, Any]]] = queue.Queue(maxsize=MAX_PENDING)

    def _put(self, events: list[dict[str, Any]]) -> None:
        while True:
            try:
                self._queue.put_nowait(events)
                return
            except queue.Full:
                self.overflowed = True
                # Drop the oldest batch: the stream stays live, the page re-reads the store.
                with contextlib.suppress(queue.Empty):
                    self._queue.get_nowait()

    def get(self, timeout: float | None = None) -> list[dict[str, Any]] | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._hub.remove(self._key, self)


class _LocalHub:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: dict[str, set[_LocalSubscription]] = {}

    def subscribe(self, key: str) -> _LocalSubscription:
        subscription = _LocalSubscription(self, key)
        with self._lock:
            self._subscribers.setdefault(key, set()).add(subscription)
        return subscription

    def remove(self, key: str, subscription: _LocalSubscription) -> None:
        with self._lock:
            subscribers = self._subscribers.get(key)
            if subscribers is not None:
                subscribers.discard(subscription)
                if not subscribers:
                    del self._subscribers[key]

    def publish(self, key: str, events: list[dict[str, Any]]) -> None:
        with self._lock:
            subscribers = list(self._subscribers.get(key, ()))
        for subscription in subscribers:
            subscription._put(events)

    def subscriber_count(self, key: str) -> int:
        with self._lock:
            return len(self._subscribers.get(key, ()))


_local_hub = _LocalHub()


# --- Redis -----------------------------------------------------------------------------------


@lru_cache(maxsize=4)
def _redis_client(url: str):
    import redis

    return redis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)


class _RedisSubscription(Subscription):
    def __init__(self, url: str, name: str):
        self._pubsub = _redis_client(url).pubsub()
        self._pubsub.subscribe(name)
        # Wait for the server's confirmation: a batch published after subscribe() returns is then
        # guaranteed to reach this subscriber.
        deadline = time.monotonic() + _SUBSCRIBE_TIMEOUT_S
        while True:
            message = self._pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
            if message is not None and message["type"] == "subscribe":
                break
            if time.monotonic() >= deadline:
                self._pubsub.close()
                raise TimeoutError(f"Redis did not confirm the subscription to {name} within {_SUBSCRIBE_TIMEOUT_S:g}s")

    def get(self, timeout: float | None = None) -> list[dict[str, Any]] | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = 1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            message = self._pubsub.get_message(timeout=remaining)
            if message is not None and message["type"] == "message":
                return json.loads(message["data"])["events"]
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def close(self) -> None:
        try:
            self._pubsub.close()
        except Exception:  # closing a broken connection is not worth an error
            logger.debug("closing a Redis subscription failed", exc_info=True)


# --- the API ---------------------------------------------------------------------------------


def _backend() -> str:
    return getattr(settings, "PUBSUB_BACKEND", "inprocess")


def publish(run_id: object, events: list[dict[str, Any]]) -> None:
    """Publish one accepted batch on the run's channel. Never raises (the batch is already stored)."""
    if not events:
        return
    try:
        if _backend() == "redis":
            payload = json.dumps({"run": str(run_id), "events": events}, ensure_ascii=False)
            _redis_client(settings.REDIS_URL).publish(channel(run_id), payload)
        else:
            _local_hub.publish(str(run_id), events)
    except Exception:
        logger.warning("publishing events of run %s on the live channel failed", run_id, exc_info=True)


def subscribe(run_id: object) -> Subscription:
    if _backend() == "redis":
        return _RedisSubscription(settings.REDIS_URL, channel(run_id))
    return _local_hub.subscribe(str(run_id))
