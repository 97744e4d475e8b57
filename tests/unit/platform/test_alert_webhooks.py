"""Critical alerts reach people: an experiment's webhook, checked by the outbound policy when it is set, and
a run's critical alert POSTed to it as Slack-compatible JSON by the real Celery task, which retries after a
failure. The receiver is a real HTTP server on this machine, which the policy refuses unless an admin allows
its address (POSTTRAIN_HTTP_ALLOW, here settings.HTTP_ALLOW, which is read from it)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from posttrain.runs import services
from posttrain.runs.models import AlertDelivery
from posttrain.telemetry import alerts
from posttrain.telemetry.ingestion import events_ingest
from tests.support.stack import free_port
from tests.unit.platform.helpers import an_experiment, make_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("storage")]


class Receiver:
    """A webhook receiver on 127.0.0.1 answering each POST with the next of `statuses` (then 200)."""

    def __init__(self, statuses: list[int]):
        self.statuses = list(statuses)
        self.bodies: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                receiver.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.port}/hooks/alerts"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made: list[Receiver] = []

    def make(statuses: list[int]) -> Receiver:
        made.append(Receiver(statuses))
        return made[-1]

    yield make
    for one in made:
        one.close()


def nan_loss_run(experiment):
    """A running run whose policy loss is NaN at step 3: a critical `nonfinite` alert at step 3."""
    run = make_run(experiment, "running", name="sums grpo 1")
    now = time.time()
    losses = [0.5, 0.4, "nan", 0.3]
    events_ingest(
        run.id,
        [
            {
                "run": str(run.id),
                "seq": step,
                "type": "metrics",
                "step": step,
                "time": now,
                "data": {"policy/loss": loss},
            }
            for step, loss in enumerate(losses, start=1)
        ],
    )
    return run


def test_a_webhook_inside_the_cluster_is_refused_unless_an_admin_allows_its_address(api, receiver, settings):
    experiment = an_experiment()
    hook = receiver([])
    refused = api.patch(
        f"/api/experiments/{experiment.pk}/", {"webhook_url": hook.url}, content_type="application/json"
    )
    assert refused.status_code == 400
    [error] = refused.json()["errors"]
    assert error["loc"] == "webhook_url" and "loopback" in error["msg"] and "POSTTRAIN_HTTP_ALLOW" in error["msg"]

    settings.HTTP_ALLOW = [f"127.0.0.1:{hook.port}"]
    allowed = api.patch(
        f"/api/experiments/{experiment.pk}/", {"webhook_url": hook.url}, content_type="application/json"
    )
    assert allowed.status_code == 200 and allowed.json()["webhook_url"] == hook.url
    bad = api.patch(f"/api/experiments/{experiment.pk}/", {"webhook_url": "ftp://x/"}, content_type="application/json")
    assert bad.status_code == 400 and bad.json()["errors"][0]["loc"] == "webhook_url"


def test_a_critical_alert_is_posted_once_and_retried_after_a_failure(
    experiment, receiver, settings, no_dispatch, django_capture_on_commit_callbacks
):
    from workers.tasks import alert_deliver

    hook = receiver([500])  # the first POST fails, the retry gets through
    settings.HTTP_ALLOW = [f"127.0.0.1:{hook.port}"]
    settings.PUBLIC_URL = "https://posttrain.example"
    services.experiment_set_webhook(experiment, hook.url)

    with django_capture_on_commit_callbacks(execute=True):
        run = nan_loss_run(experiment)
    assert ("run_alerts_notify", str(run.id)) in no_dispatch  # ingestion asked for a look at the alerts

    with django_capture_on_commit_callbacks(execute=True):
        assert alerts.alerts_notify(run.id) == 1
        assert alerts.alerts_notify(run.id) == 0  # once per alert, however often it is asked
    [delivery] = AlertDelivery.objects.filter(run=run)
    assert ("alert_deliver", str(delivery.pk)) in no_dispatch

    result = alert_deliver.apply(args=[str(delivery.pk)])  # the real task: its retry runs at once in apply()
    assert result.get() == "sent"
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_error) == ("sent", 2, "")
    assert len(hook.bodies) == 2 and hook.bodies[0] == hook.bodies[1]
    body = hook.bodies[1]
    assert body["text"].startswith(":rotating_light: *CRITICAL* `nonfinite` in run <https://posttrain.example/runs/")
    assert "at step 3" in body["text"]
    assert body["run"] == {
        "id": str(run.id),
        "name": "sums grpo 1",
        "experiment": "sums grpo",
        "url": f"https://posttrain.example/runs/{run.id}/#step-3",
    }
    assert body["alert"]["code"] == "nonfinite" and body["alert"]["step"] == 3
    assert body["alert"]["metric"] == "policy/loss" and body["alert"]["severity"] == "critical"


def test_a_delivery_gives_up_after_its_attempts_and_a_refused_url_fails_at_once(experiment, receiver, settings):
    hook = receiver([503] * 10)
    settings.HTTP_ALLOW = [f"127.0.0.1:{hook.port}"]
    services.experiment_set_webhook(experiment, hook.url)
    run = nan_loss_run(experiment)
    alerts.alerts_notify(run.id)
    delivery = AlertDelivery.objects.get(run=run)
    outcomes = [alerts.alert_deliver(delivery.pk) for _ in range(5)]
    assert outcomes == [("retry", 5.0), ("retry", 30.0), ("retry", 120.0), ("retry", 600.0), ("failed", None)]
    delivery.refresh_from_db()
    assert (
        delivery.state == "failed" and delivery.last_error == "gave up after 5 attempts: HTTP 503 Service Unavailable"
    )
    assert alerts.alert_deliver(delivery.pk) == ("skipped", None)

    other = make_run(experiment, "running")
    refused = AlertDelivery.objects.create(run=other, code="x", metric="m", step=1, url=hook.url, payload={})
    settings.HTTP_ALLOW = []  # the admin withdrew the address: the policy refuses it at the POST
    assert alerts.alert_deliver(refused.pk) == ("failed", None)
    refused.refresh_from_db()
    assert refused.last_error.startswith("refused by the outbound policy") and len(hook.bodies) == 5


def test_an_experiment_without_a_webhook_sends_nothing(experiment, no_dispatch):
    run = nan_loss_run(experiment)
    assert ("run_alerts_notify", str(run.id)) not in no_dispatch
    assert alerts.alerts_notify(run.id) == 0 and not AlertDelivery.objects.exists()
