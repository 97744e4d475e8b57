"""The live channel of a run, with both backends: in-process and Redis pub/sub."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from posttrain.telemetry import live_channel


@pytest.fixture(params=["inprocess", "redis"])
def backend(request, settings) -> str:
    if request.param == "redis":
        url = os.environ.get("REDIS_URL")
        if not url:
            pytest.fail("the Redis backend test needs REDIS_URL (a real Redis); run it with `make test`")
        settings.REDIS_URL = url
    settings.PUBSUB_BACKEND = request.param
    return request.param


def batch(run_id: str, first: int, n: int = 2) -> list[dict]:
    return [
        {
            "run": run_id,
            "seq": first + i,
            "type": "metrics",
            "step": first + i,
            "time": 1.0,
            "data": {"reward/mean": 0.5, "note": "é"},
        }
        for i in range(n)
    ]


def test_a_subscriber_receives_each_published_batch_of_its_run_only(backend):
    with live_channel.subscribe("run-a") as a, live_channel.subscribe("run-b") as b:
        live_channel.publish("run-a", batch("run-a", 1))
        live_channel.publish("run-a", batch("run-a", 3))
        assert a.get(timeout=5) == batch("run-a", 1)
        assert a.get(timeout=5) == batch("run-a", 3)
        assert b.get(timeout=0.2) is None


def test_every_subscriber_of_a_run_gets_the_batch(backend):
    with live_channel.subscribe("run-c") as first, live_channel.subscribe("run-c") as second:
        live_channel.publish("run-c", batch("run-c", 1))
        assert first.get(timeout=5) == second.get(timeout=5) == batch("run-c", 1)


def test_a_batch_published_from_another_thread_reaches_an_async_subscriber(backend):
    async def listen() -> list[dict] | None:
        async with live_channel.subscribe("run-d") as subscription:
            threading.Timer(0.1, live_channel.publish, args=("run-d", batch("run-d", 7))).start()
            return await subscription.aget(timeout=5)

    assert asyncio.run(listen()) == batch("run-d", 7)


def test_publishing_never_raises_even_when_redis_is_down(settings):
    settings.PUBSUB_BACKEND = "redis"
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    live_channel.publish("run-e", batch("run-e", 1))  # logged, not raised: the events are already stored


def test_a_closed_in_process_subscription_is_forgotten(settings):
    settings.PUBSUB_BACKEND = "inprocess"
    subscription = live_channel.subscribe("run-f")
    assert live_channel._local_hub.subscriber_count("run-f") == 1
    subscription.close()
    assert live_channel._local_hub.subscriber_count("run-f") == 0
    live_channel.publish("run-f", batch("run-f", 1))


def test_a_slow_in_process_subscriber_drops_the_oldest_batches_and_knows_it(settings, monkeypatch):
    settings.PUBSUB_BACKEND = "inprocess"
    monkeypatch.setattr(live_channel, "MAX_PENDING", 2)
    with live_channel.subscribe("run-g") as subscription:
        for first in (1, 3, 5):
            live_channel.publish("run-g", batch("run-g", first))
        assert subscription.overflowed
        assert subscription.get(timeout=1) == batch("run-g", 3)
