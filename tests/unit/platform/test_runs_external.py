"""External runs (tracked from other engines through the SDK): created running with a token, driven by
their client's events, never dispatched to Ray, failed as lost when their client goes silent, listed,
shown and compared like native runs."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from posttrain.runs import services
from posttrain.runs.models import Experiment, Run, RunState
from posttrain.scheduling import services as scheduling_services
from tests.unit.platform.helpers import (
    FakeJobs,
    auth,
    event,
    join,
    make_run,
    post_events,
    sample_record,
    samples_event,
)

pytestmark = pytest.mark.django_db


def track(api, **body) -> dict:
    response = api.post(
        "/api/runs/external/",
        data=json.dumps({"experiment": "gsm8k trl", "engine": "trl", **body}),
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    return response.json()


def test_tracking_creates_a_running_external_run_in_an_experiment_with_its_token(api, no_dispatch):
    answer = track(api, name="qwen lr=1e-6", config={"learning_rate": 1e-6}, total_steps=40, tags=["trl"])
    run = answer["run"]
    assert run["state"] == "running" and run["kind"] == "external" and run["engine"] == "trl"
    assert run["total_steps"] == 40 and run["model_name"] is None and run["resolved_config"] == {"learning_rate": 1e-6}
    assert answer["events_url"].endswith(f"/api/runs/{run['id']}/events") and answer["ingest_token"]
    again = track(api)["run"]
    assert again["experiment"] == run["experiment"] and again["name"] == "gsm8k trl #2"  # one experiment
    assert run["project_name"] == "default"  # the one project the researcher creates in
    assert Experiment.objects.get(pk=run["experiment"]).is_external
    assert no_dispatch == []  # no Celery task, no Ray job


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"experiment": ""}, "experiment"),
        ({"engine": "posttrain"}, "engine"),
        ({"engine": "T R L"}, "engine"),
        ({"config": [1, 2]}, "config"),
        ({"config": {"a": "x\x00"}}, "config.a"),
        ({"tags": ["ok", ""]}, "tags[1]"),
        ({"total_steps": 0}, "total_steps"),
    ],
)
def test_bad_tracking_requests_name_the_field(api, body, loc):
    response = api.post(
        "/api/runs/external/", data=json.dumps({"experiment": "p", **body}), content_type="application/json"
    )
    assert response.status_code == 400
    assert loc in [e["loc"] for e in response.json()["errors"]]


def test_an_experiment_name_taken_by_an_experiment_of_native_runs_is_refused(api, experiment):
    response = api.post(
        "/api/runs/external/", data=json.dumps({"experiment": experiment.name}), content_type="application/json"
    )
    assert response.status_code == 400 and response.json()["errors"][0]["loc"] == "experiment"


def test_tracking_into_a_project_the_researcher_only_views_is_refused(api, researcher):
    from posttrain.projects.models import Project

    watched = Project.objects.create(name="watched")
    join(researcher, "viewer", watched)
    response = api.post(
        "/api/runs/external/",
        data=json.dumps({"experiment": "x", "project": "watched"}),
        content_type="application/json",
    )
    assert response.status_code == 403 and "viewer" in response.json()["errors"][0]["msg"]


def test_the_clients_events_and_final_status_drive_the_run(client, api):
    run = Run.objects.get(pk=track(api)["run"]["id"])
    events = [
        event(run, 1, "status", data={"state": "running"}),
        event(run, 2, "metrics", step=0, data={"reward/mean": 0.25, "kl/mean": 0.0}),
        samples_event(run, 3, 0, [sample_record(0), sample_record(1, reward=0.0)]),
        event(run, 4, "log", data={"level": "info", "message": "hello from trl"}),
        event(run, 5, "status", data={"state": "succeeded"}),
    ]
    assert post_events(client, run, events).json() == {"acknowledged_seq": 5, "stored": 5}
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED and run.summary["reward/mean"]["last"] == 0.25
    assert run.rollout_files.get().rows == 2
    logs = api.get(f"/api/runs/{run.pk}/logs/").json()
    assert logs == {"logs": "[info] hello from trl\n", "truncated": False, "job": None}


def test_the_reconcile_never_asks_ray_about_external_runs_and_fails_silent_ones_as_lost(api, settings):
    settings.RUN_HEARTBEAT_TIMEOUT_S = 30
    silent = Run.objects.get(pk=track(api)["run"]["id"])
    alive = Run.objects.get(pk=track(api)["run"]["id"])
    long_ago = timezone.now() - timedelta(seconds=31)
    Run.objects.filter(pk=silent.pk).update(last_event_at=long_ago)
    Run.objects.filter(pk=alive.pk).update(last_event_at=timezone.now())
    jobs = FakeJobs()
    scheduling_services.runs_reconcile(jobs=jobs)
    silent.refresh_from_db()
    alive.refresh_from_db()
    assert silent.state == RunState.FAILED and silent.state_reason.startswith("lost: the client sent nothing for 30s")
    assert alive.state == RunState.RUNNING
    assert jobs.submitted == [] and jobs.stopped == []


def test_a_run_whose_client_never_sent_anything_is_lost_after_the_timeout_from_its_start(api, settings):
    settings.RUN_HEARTBEAT_TIMEOUT_S = 30
    run = Run.objects.get(pk=track(api)["run"]["id"])
    assert services.external_runs_fail_lost(now=timezone.now() + timedelta(seconds=10)) == 0
    assert services.external_runs_fail_lost(now=timezone.now() + timedelta(seconds=31)) == 1
    run.refresh_from_db()
    assert run.state == RunState.FAILED


def lose(run, settings) -> None:
    settings.RUN_HEARTBEAT_TIMEOUT_S = 30
    Run.objects.filter(pk=run.pk).update(last_event_at=timezone.now() - timedelta(seconds=31))
    assert services.external_runs_fail_lost() == 1
    run.refresh_from_db()
    assert run.state == RunState.FAILED and run.finished_at is not None


def test_a_lost_run_whose_client_is_heard_again_runs_again_and_its_finish_ends_it(client, api, settings):
    # The server may have been the silent one (down, restarting, overloaded) while the client kept its events.
    run = Run.objects.get(pk=track(api)["run"]["id"])
    lose(run, settings)
    assert post_events(client, run, [event(run, 1, "heartbeat")]).status_code == 200
    run.refresh_from_db()
    assert run.state == RunState.RUNNING and run.finished_at is None and "heard" in run.state_reason
    assert list(run.transitions.values_list("from_state", "to_state")) == [
        ("draft", "running"),
        ("running", "failed"),
        ("failed", "running"),
    ]
    assert post_events(client, run, [event(run, 2, "status", data={"state": "succeeded"})]).status_code == 200
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED


def test_a_lost_runs_rollout_upload_revives_it_and_is_stored(client, api, settings):
    from posttrain_sdk import rollout_files

    run = Run.objects.get(pk=track(api)["run"]["id"])
    lose(run, settings)
    body = rollout_files.encode(rollout_files.rows_table([sample_record(0), sample_record(1)], 1, {}))
    upload = f"/api/runs/{run.pk}/rollouts/step_00000001.parquet/upload"
    assert client.put(upload, data=body, content_type="application/vnd.apache.parquet", **auth(run)).status_code == 201
    run.refresh_from_db()
    assert run.state == RunState.RUNNING


def test_only_a_lost_external_run_comes_back(client, api, experiment, no_dispatch):
    cancelled = Run.objects.get(pk=track(api)["run"]["id"])
    assert api.post(f"/api/runs/{cancelled.pk}/cancel/").status_code == 200
    failed_by_client = Run.objects.get(pk=track(api)["run"]["id"])
    post_events(client, failed_by_client, [event(failed_by_client, 1, "status", data={"state": "failed"})])
    assert post_events(client, failed_by_client, [event(failed_by_client, 2, "heartbeat")]).status_code == 200
    native = make_run(experiment, RunState.FAILED, state_reason="lost: the engine sent nothing")
    assert not services.run_revive_lost(native.pk) and not services.run_revive_lost(cancelled.pk)
    for run, state in ((cancelled, RunState.CANCELLED), (failed_by_client, RunState.FAILED), (native, RunState.FAILED)):
        run.refresh_from_db()
        assert run.state == state


def test_cancelling_an_external_run_ends_it_at_once_and_late_events_are_still_stored(client, api, no_dispatch):
    run = Run.objects.get(pk=track(api)["run"]["id"])
    response = api.post(f"/api/runs/{run.pk}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == "cancelled" and no_dispatch == []
    late = [
        event(run, 1, "metrics", step=3, data={"reward/mean": 1.0}),
        event(run, 2, "status", data={"state": "succeeded"}),
    ]
    assert post_events(client, run, late).status_code == 200
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED and run.last_step == 3
    assert api.post(f"/api/runs/{run.pk}/cancel/").status_code == 409


def test_an_external_run_cannot_be_cloned_resumed_or_launched_again(api, no_dispatch):
    answer = track(api)["run"]
    assert api.post(f"/api/runs/{answer['id']}/clone/", data={}, content_type="application/json").status_code == 409
    launch = api.post(f"/api/experiments/{answer['experiment']}/launch/", data={}, content_type="application/json")
    assert launch.status_code == 400 and launch.json()["errors"][0]["loc"] == "experiment"


def test_the_runs_list_filters_by_kind_and_shows_external_runs_next_to_native_ones(api, experiment, no_dispatch):
    native = make_run(experiment)
    external = track(api)["run"]
    every = {r["id"]: r for r in api.get("/api/runs/").json()["results"]}
    assert {str(native.pk), external["id"]} <= set(every)
    assert every[str(native.pk)]["kind"] == "native" and every[str(native.pk)]["total_steps"] == 2
    only = api.get("/api/runs/", {"kind": "external"}).json()["results"]
    assert [r["id"] for r in only] == [external["id"]]
    compared = api.get("/api/compare/", {"runs": f"{native.pk},{external['id']}"})
    assert compared.status_code == 200


def test_the_run_page_of_an_external_run_names_its_engine_and_offers_no_clone(api):
    run = track(api, total_steps=12)["run"]
    page = api.get(f"/runs/{run['id']}/").content.decode()
    assert "external · trl" in page and 'id="clone-run"' not in page and "/ 12" in page


def test_a_review_campaign_pairs_an_external_runs_answers_with_a_native_runs(client, api, experiment, make_user):
    from posttrain.review.models import ReviewItem
    from tests.unit.platform.helpers import pair_campaign, run_with_samples, sample

    native = run_with_samples(experiment, {1: [sample(0, 1.0, "2+2=", "4"), sample(1, 0.0, "3+3=", "7")]})
    external = Run.objects.get(pk=track(api)["run"]["id"])
    answers = [sample(0, 0.0, "2+2=", "5"), sample(1, 1.0, "3+3=", "6")]
    assert post_events(client, external, [samples_event(external, 1, 1, answers)]).status_code == 200
    campaign = pair_campaign([native, external], [make_user("annotator")], k=2)
    items = ReviewItem.objects.filter(campaign=campaign)
    assert items.count() == 2
    for item in items:
        assert {item.rollout_a.run_id, item.rollout_b.run_id} == {native.pk, external.pk}
        assert item.rollout_a.prompt == item.rollout_b.prompt
