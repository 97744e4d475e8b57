"""Redis (the live channel and the Celery broker) killed mid-run and restarted: ingestion goes on while it
is down, a live page's stream reconnects and catches up with no gap and no duplicate, the worker
reconnects to the broker and takes new work."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from tests.faults.invariants import assert_run_ended_truthfully
from tests.support.api import Api, create_experiment, launch, run_config, run_folder_events

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class LivePage:
    """What the run page's EventSource does: read the run's stream, and on a drop reconnect with
    Last-Event-ID, until the `end` message."""

    def __init__(self, api: Api, run_id: str):
        self.url = f"{api.base}/api/runs/{run_id}/stream/"
        self.headers = dict(api.session.headers)
        self.ids: list[int] = []
        self.connections = 0
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        from posttrain_sdk.sse import read_stream

        deadline = time.monotonic() + 300
        while not self.ended.is_set() and time.monotonic() < deadline:
            headers = {**self.headers, **({"Last-Event-ID": str(self.ids[-1])} if self.ids else {})}
            try:
                with requests.get(self.url, headers=headers, stream=True, timeout=(5, 30)) as response:
                    self.connections += 1
                    for message in read_stream(response.iter_lines(decode_unicode=True)):
                        if message.id is not None:
                            self.ids.append(message.id)
                        if message.event == "end":
                            self.ended.set()
                            return
            except requests.RequestException:
                pass
            time.sleep(1.0)  # the server's `retry: 1000`


def stored_seq(run_id: str) -> int:
    from posttrain.runs.models import Run

    return Run.objects.get(pk=run_id).last_seq


def test_redis_killed_and_restarted_mid_run_loses_nothing_and_the_live_page_catches_up(
    api, registry, stack, private_redis
):
    # Long enough (~10 s alone) to still be training after Redis is killed: 25 steps took ~1 s.
    experiment = create_experiment(api, registry, "redis restart", run_config(200))
    run = launch(api, experiment)
    api.wait_for(run["id"], lambda r: r["state"] == "running" and (r["last_step"] or 0) >= 2, what="two steps")
    page = LivePage(api, run["id"])

    private_redis.kill()
    at_kill = stored_seq(run["id"])
    deadline = time.monotonic() + 60
    while stored_seq(run["id"]) < at_kill + 5:  # events keep being stored while Redis is down
        assert time.monotonic() < deadline, "ingestion stopped with Redis"
        time.sleep(0.2)
    private_redis.start()

    run = assert_run_ended_truthfully(api, stack, run["id"], "succeeded", "engine finished every step")
    assert page.ended.wait(60), f"the live page never saw the end (ids up to {page.ids[-1:]})"
    assert page.connections >= 2, "the stream was never dropped: Redis was not in its path"
    with_ids = [e["seq"] for e in run_folder_events(run) if e["type"] in ("metrics", "samples", "log", "checkpoint")]
    assert page.ids == with_ids, "the live page missed or repeated events"

    # The worker is back on the broker: a new run is submitted and runs.
    again = launch(api, create_experiment(api, registry, "after redis", run_config(2)), seed=2)
    assert_run_ended_truthfully(api, stack, again["id"], "succeeded", "engine finished every step")
