"""Reads of a run: metric series, samples, checkpoints, transitions and the Ray job's logs."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from posttrain.runs.models import Checkpoint, RunState
from posttrain.telemetry.ingestion import events_ingest
from tests.unit.platform.helpers import event, make_run, sample_record, samples_event

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]


@pytest.fixture
def run(experiment):
    run = make_run(experiment, RunState.RUNNING)
    events, seq = [], 1
    for step in (1, 2, 3):
        metrics = {"reward/mean": 0.1 * step, "timing/generate": 1.5}
        if step == 2:
            metrics["kl/mean"] = "nan"
        samples = [
            sample_record(
                i,
                reward=float(i % 2),
                advantage=i - 1.5,
                length=i + 1,
                finish_reason="length" if i == 3 else "stop",
                response=f"answer {step}-{i}",
            )
            for i in range(4)
        ]
        events += [
            event(run, seq, "metrics", step, metrics),
            samples_event(run, seq + 1, step, samples),
        ]
        seq += 2
    events_ingest(run.id, events)
    return run


def get(api, url: str, **params):
    response = api.get(url, params)
    return response.status_code, response.json()


def test_metric_series_come_per_name_in_step_order(api, run):
    status, body = get(api, f"/api/runs/{run.id}/metrics/", names="reward/mean,kl/mean,missing")
    assert status == 200
    series = body["series"]
    assert series["reward/mean"]["steps"] == [1, 2, 3]
    assert series["reward/mean"]["values"] == pytest.approx([0.1, 0.2, 0.3])
    assert series["kl/mean"] == {"steps": [2], "values": [None]}  # "nan" is a gap, not an error
    assert series["missing"] == {"steps": [], "values": []}


def test_metric_series_respect_the_step_range_and_default_to_every_metric(api, run):
    _, body = get(api, f"/api/runs/{run.id}/metrics/", step_min=2, step_max=2)
    assert sorted(body["series"]) == ["kl/mean", "reward/mean", "timing/generate"]
    assert body["series"]["reward/mean"]["steps"] == [2]


def test_a_bad_step_bound_is_a_400_naming_it(api, run):
    status, body = get(api, f"/api/runs/{run.id}/metrics/", step_min="two")
    assert status == 400 and body["errors"][0]["loc"] == "step_min"


def test_samples_are_paginated_and_filtered(api, run):
    status, body = get(api, f"/api/runs/{run.id}/samples/", limit=5)
    assert status == 200 and body["count"] == 12 and len(body["results"]) == 5
    assert [(s["step"], s["index"]) for s in body["results"][:2]] == [(1, 0), (1, 1)]
    assert get(api, f"/api/runs/{run.id}/samples/", step=2)[1]["count"] == 4
    assert get(api, f"/api/runs/{run.id}/samples/", min_reward=0.5)[1]["count"] == 6
    assert get(api, f"/api/runs/{run.id}/samples/", max_reward=0.5, step=1)[1]["count"] == 2
    assert get(api, f"/api/runs/{run.id}/samples/", finish_reason="length")[1]["count"] == 3
    _, found = get(api, f"/api/runs/{run.id}/samples/", q="ANSWER 3-2")
    assert [(s["step"], s["index"]) for s in found["results"]] == [(3, 2)]
    # A text search is not counted (that would read every response): the page pages with `next`.
    assert found["count"] is None and found["next"] is None


def test_samples_are_filtered_by_advantage_and_response_length(api, run):
    # Each step's four samples have advantages -1.5, -0.5, 0.5, 1.5 and lengths 1, 2, 3, 4.
    assert get(api, f"/api/runs/{run.id}/samples/", min_advantage=0)[1]["count"] == 6
    _, lowest = get(api, f"/api/runs/{run.id}/samples/", max_advantage=-1, step=1)
    assert [(s["index"], s["advantage"]) for s in lowest["results"]] == [(0, -1.5)]
    _, three = get(api, f"/api/runs/{run.id}/samples/", min_length=3, max_length=3)
    assert [(s["step"], s["index"]) for s in three["results"]] == [(1, 2), (2, 2), (3, 2)]
    assert get(api, f"/api/runs/{run.id}/samples/", min_advantage=1, min_length=4, min_reward=1)[1]["count"] == 3
    assert get(api, f"/api/runs/{run.id}/samples/", min_length=5)[1]["count"] == 0


def test_nul_characters_in_text_filters_are_dropped_not_a_server_error(api, run):
    assert get(api, f"/api/runs/{run.id}/samples/", q="answer\x00 3-2")[0] == 200
    assert get(api, f"/api/runs/{run.id}/metrics/", names="reward/mean\x00")[0] == 200


def test_admin_pages_of_runs_experiments_telemetry_and_quotas_open(admin_client, run):
    for url in (
        "/admin/runs/run/",
        f"/admin/runs/run/{run.id}/change/",
        "/admin/runs/experiment/",
        f"/admin/runs/experiment/{run.experiment_id}/change/",
        "/admin/telemetry/rolloutfile/",
        "/admin/telemetry/metricrow/",
        "/admin/telemetry/runlog/",
        "/admin/scheduling/quota/",
    ):
        assert admin_client.get(url).status_code == 200, url


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("step", "x"),
        ("min_reward", "high"),
        ("max_reward", "inf"),
        ("min_advantage", "nan"),
        ("max_advantage", "big"),
        ("min_length", "-1"),
        ("max_length", "99999999999999999999"),
    ],
)
def test_bad_sample_filters_are_400_naming_them(api, run, param, value):
    status, body = get(api, f"/api/runs/{run.id}/samples/", **{param: value})
    assert status == 400 and body["errors"][0]["loc"] == param


def test_checkpoints_and_transitions_are_listed(api, run):
    Checkpoint.objects.create(run=run, step=2, path="/s/step_2")
    Checkpoint.objects.create(run=run, step=1, path="/s/step_1")
    _, checkpoints = get(api, f"/api/runs/{run.id}/checkpoints/")
    assert [c["step"] for c in checkpoints] == [1, 2]
    _, transitions = get(api, f"/api/runs/{run.id}/transitions/")
    assert transitions[0]["from_state"] == "draft" and transitions[0]["reason"].startswith("launched by")


def test_a_run_detail_carries_its_resolved_config(api, run):
    _, body = get(api, f"/api/runs/{run.id}/")
    assert body["state"] == "running" and body["last_seq"] == 6 and body["last_step"] == 3
    assert body["resolved_config"]["logging"]["run_dir"].endswith(str(run.id))


class _FakeRayDashboard(BaseHTTPRequestHandler):
    logs: dict[str, str] = {}

    def do_GET(self):
        parts = self.path.strip("/").split("/")
        if parts[:2] == ["api", "jobs"] and parts[-1] == "logs" and parts[2] in self.logs:
            body, status = json.dumps({"logs": self.logs[parts[2]]}).encode(), 200
        else:
            body, status = b"Job does not exist", 404
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def ray_dashboard(settings):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeRayDashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.RAY_ADDRESS = f"http://127.0.0.1:{server.server_port}"
    yield _FakeRayDashboard.logs
    server.shutdown()
    server.server_close()


def test_logs_of_the_ray_job_are_read_over_the_jobs_http_api(api, run, ray_dashboard):
    ray_dashboard[str(run.id)] = "run folder: /x\n" + "step 1\n" * 10
    status, body = get(api, f"/api/runs/{run.id}/logs/")
    assert status == 200 and body["logs"].startswith("run folder") and body["truncated"] is False
    _, tail = get(api, f"/api/runs/{run.id}/logs/", tail=7)
    assert tail == {"logs": "step 1\n", "truncated": True, "job": str(run.id)}


def test_logs_of_a_run_without_a_job_are_empty_and_an_unreachable_ray_is_a_503(api, run, ray_dashboard, settings):
    assert get(api, f"/api/runs/{run.id}/logs/")[1] == {"logs": "", "truncated": False, "job": None}
    settings.RAY_ADDRESS = "http://127.0.0.1:1"
    status, body = get(api, f"/api/runs/{run.id}/logs/")
    assert status == 503 and "cannot read the job's logs" in body["errors"][0]["msg"]


def test_a_checkpoint_whose_folder_the_engine_pruned_is_listed_as_unavailable(api, run, tmp_path):
    kept = tmp_path / "step_4"
    kept.mkdir()
    Checkpoint.objects.create(run=run, step=2, path=str(tmp_path / "step_2"))  # pruned by keep_last
    Checkpoint.objects.create(run=run, step=4, path=str(kept))
    _, checkpoints = get(api, f"/api/runs/{run.id}/checkpoints/")
    assert [(c["step"], c["available"]) for c in checkpoints] == [(2, False), (4, True)]
