"""The scheduler's metrics (posttrain.scheduling.metrics) on a hand-made history, as JSON for the queue page
(GET /api/queue/stats/) and in Prometheus's text format (GET /api/queue/metrics)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from posttrain.runs.models import Run, RunTransition
from posttrain.runs.services.state_machine import S
from posttrain.scheduling.metrics import queue_metrics
from posttrain.scheduling.models import ClusterSample, Preemption
from posttrain.telemetry.models import MetricRow
from tests.unit.platform.helpers import make_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]


def history(run: Run, moves: list[tuple[str, str, float]], t0) -> None:
    """The run's transitions, each at t0 + seconds."""
    RunTransition.objects.filter(run=run).delete()
    for old, new, at in moves:
        row = RunTransition.objects.create(run=run, from_state=old, to_state=new)
        RunTransition.objects.filter(pk=row.pk).update(at=t0 + timedelta(seconds=at))


@pytest.fixture
def hand_made(experiment, researcher):
    now = timezone.now()
    t0 = now - timedelta(hours=1)
    normal = make_run(experiment, S.SUCCEEDED, created_by=researcher, priority="normal")
    history(
        normal,
        [
            ("draft", "queued", 0),
            ("queued", "starting", 60),
            ("starting", "running", 70),
            ("running", "succeeded", 400),
        ],
        t0,
    )
    MetricRow.objects.create(run=normal, seq=1, step=0, time=(t0 + timedelta(seconds=75)).timestamp(), values={})
    MetricRow.objects.create(run=normal, seq=2, step=1, time=(t0 + timedelta(seconds=100)).timestamp(), values={})
    high = make_run(experiment, S.SUCCEEDED, created_by=researcher, priority="high")
    history(high, [("draft", "queued", 10), ("queued", "starting", 30), ("running", "succeeded", 50)], t0)
    # A preempted run waits twice: 5 s, then 100 s after its preemption (a second admission, not a first step).
    resumed = make_run(experiment, S.RUNNING, created_by=researcher, priority="normal")
    history(
        resumed,
        [
            ("draft", "queued", 0),
            ("queued", "starting", 5),
            ("running", "preempting", 200),
            ("preempting", "preempted", 210),
            ("preempted", "starting", 310),
        ],
        t0,
    )
    Preemption.objects.create(run=resumed, forced=True, lost_steps=3, settled_at=now)
    Preemption.objects.create(run=resumed, forced=False, lost_steps=0, settled_at=now)
    ClusterSample.objects.all().delete()  # these four samples are the cluster's whole history
    for at, granted, used in ((0, 2, 1), (600, 4, 3), (1200, 4, 4), (1800, 0, 0)):
        ClusterSample.objects.create(
            at=t0 + timedelta(seconds=at),
            total={"CPU": 4.0, "GPU": 0.0},
            granted={"CPU": float(granted), "GPU": 0.0},
            used={"CPU": float(used), "GPU": 0.0},
        )
    return now


def test_metrics_on_a_hand_made_history(hand_made):
    got = queue_metrics(now=hand_made)
    assert got["queue_wait"] == {
        "high": {"count": 1, "p50_s": 20.0, "p95_s": 20.0},
        "normal": {"count": 3, "p50_s": 60.0, "p95_s": 96.0},  # 5, 60 and 100 s
    }
    assert got["admission_to_first_step"] == {"count": 1, "p50_s": 40.0, "p95_s": 40.0}  # step 0 is an evaluation
    utilisation = got["utilisation"]
    assert (utilisation["granted_CPU"], utilisation["used_CPU"], utilisation["granted_GPU"]) == (0.625, 0.5, None)
    # A day in 120 buckets of 12 min: the samples at 0 and 10 min share one (their mean), the others one each.
    assert utilisation["series"]["granted_CPU"] == [0.75, 1.0, 0.0] and len(utilisation["series"]["at"]) == 3
    assert got["preemptions"] == {"count": 2, "forced": 1, "lost_steps": 3}
    assert got["totals"] == {"preemptions": 2, "forced_preemptions": 1, "lost_steps": 3}
    users = got["shares"]["users"]
    assert [u["name"] for u in users] == ["ada"] and users[0]["share"] == 1.0 and users[0]["weight_share"] == 1.0


def test_the_queue_page_reads_the_metrics_as_json_and_prometheus_as_text(api, hand_made):
    stats = api.get("/api/queue/stats/?window_s=7200").json()
    assert stats["window_s"] == 7200 and stats["preemptions"]["lost_steps"] == 3
    scraped = api.get("/api/queue/metrics", HTTP_ACCEPT="application/openmetrics-text;version=1.0.0,text/plain;q=0.5")
    assert scraped.status_code == 200 and scraped["Content-Type"].startswith("text/plain; version=0.0.4")
    text = scraped.content.decode()
    assert 'posttrain_queue_wait_seconds{priority="normal",quantile="0.5",window_s="86400"} 60.0' in text
    assert 'posttrain_preemptions_total{forced="true"} 1.0' in text
    assert "posttrain_preemption_lost_steps_total 3.0" in text
    assert 'posttrain_cluster_utilisation_ratio{kind="granted",resource="CPU",window_s="86400"} 0.625' in text
    assert 'posttrain_fair_share_ratio{kind="user",name="ada",of="usage"} 1.0' in text


def test_a_window_out_of_range_names_the_parameter(api):
    refused = api.get("/api/queue/stats/?window_s=1")
    assert refused.status_code == 400 and refused.json()["errors"][0]["loc"] == "window_s"
    assert api.get("/api/queue/metrics?window_s=abc").json()["errors"][0]["loc"] == "window_s"
