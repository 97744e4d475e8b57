"""The queue's REST API and page: GET /api/queue/, POST /api/runs/<id>/priority/, queue_position on runs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from posttrain.runs.models import Run
from posttrain.runs.services.state_machine import S
from posttrain.scheduling.models import ClusterSnapshot
from tests.unit.platform.helpers import a_full_one_cpu_cluster, a_researcher, make_run, post

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]


def test_the_queue_lists_waiting_runs_in_order_running_runs_with_grants_and_the_nodes(api, experiment, researcher):
    now = timezone.now()
    running = make_run(experiment, S.RUNNING, started_at=now - timedelta(seconds=100), last_step=10)
    second = make_run(experiment, queue_position=2, queue_reason="1 run ahead")
    first = make_run(
        experiment,
        queue_position=1,
        queue_reason="needs 1 CPU, 0 free",
        created_by=researcher,
        queue_estimated_start=now + timedelta(seconds=70),
    )
    a_full_one_cpu_cluster(taken_at=now)
    body = api.get("/api/queue/").json()
    assert [(r["id"], r["queue_position"], r["reason"]) for r in body["waiting"]] == [
        (str(first.pk), 1, "needs 1 CPU, 0 free"),
        (str(second.pk), 2, "1 run ahead"),
    ]
    assert body["waiting"][0]["owner"] == "ada" and body["waiting"][0]["resources"] == {"CPU": 1.0, "GPU": 0.0}
    assert body["waiting"][0]["estimated_start"] is not None and body["waiting"][1]["estimated_start"] is None
    assert [(r["id"], r["grant"]) for r in body["running"]] == [(str(running.pk), {"CPU": 1.0, "GPU": 0.0})]
    assert body["cluster"]["nodes"][0]["free"] == {"CPU": 0.0, "GPU": 0.0}
    assert api.get(f"/api/runs/{first.pk}/").json()["queue_position"] == 1


def test_the_cluster_snapshot_says_how_old_it_is(api):
    ClusterSnapshot.objects.create(pk=1, taken_at=timezone.now() - timedelta(seconds=42))
    assert 42 <= api.get("/api/queue/").json()["cluster"]["age_s"] < 60


def test_the_owner_raises_priority_within_low_to_high_and_the_queue_is_ordered_again(
    api, experiment, researcher, no_dispatch, django_capture_on_commit_callbacks
):
    run = make_run(experiment, created_by=researcher)
    no_dispatch.clear()
    with django_capture_on_commit_callbacks(execute=True):
        response = post(api, f"/api/runs/{run.pk}/priority/", {"priority": "high"})
    assert response.status_code == 200 and response.json()["priority"] == "high"
    assert no_dispatch == [("admit_runs", str(run.pk))]


def test_urgent_is_for_admins_and_an_unknown_priority_names_the_field(api, experiment, researcher, client_for):
    run = make_run(experiment, created_by=researcher)
    refused = post(api, f"/api/runs/{run.pk}/priority/", {"priority": "urgent"})
    assert refused.status_code == 403 and refused.json()["errors"][0]["loc"] == "priority"
    wrong = post(api, f"/api/runs/{run.pk}/priority/", {"priority": "asap"})
    assert wrong.status_code == 400 and wrong.json()["errors"][0]["loc"] == "priority"
    assert post(client_for("admin"), f"/api/runs/{run.pk}/priority/", {"priority": "urgent"}).status_code == 200


def test_only_the_runs_creator_a_maintainer_or_an_admin_changes_its_priority(experiment, client):
    run = make_run(experiment)
    client.force_login(a_researcher("bob"))
    refused = post(client, f"/api/runs/{run.pk}/priority/", {"priority": "low"})
    assert refused.status_code == 403 and "owner" in refused.json()["errors"][0]["msg"]


def test_a_finished_runs_priority_cannot_change(api, experiment, researcher):
    run = make_run(experiment, S.SUCCEEDED, created_by=researcher)
    response = post(api, f"/api/runs/{run.pk}/priority/", {"priority": "low"})
    assert response.status_code == 409 and response.json()["state"] == "succeeded"


def test_launch_takes_a_priority_and_refuses_unpreemptible_runs_without_the_permission(api, experiment):
    launched = post(api, f"/api/experiments/{experiment.pk}/launch/", {"priority": "low"})
    assert launched.status_code == 201 and launched.json()["priority"] == "low"
    refused = post(api, f"/api/experiments/{experiment.pk}/launch/", {"preemptible": False})
    assert refused.status_code == 403 and refused.json()["errors"][0]["loc"] == "preemptible"
    assert Run.objects.count() == 1
