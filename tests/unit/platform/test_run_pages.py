"""The server-rendered pages: who may open them, and what the run page embeds for its script."""

from __future__ import annotations

import json

import pytest

from posttrain.telemetry.ingestion import events_ingest
from rl_engine.metric_catalogue import catalogue_json
from tests.unit.platform.helpers import event, make_run

pytestmark = pytest.mark.django_db

PAGES = ["/runs/", "/compare/", "/launch/", "/queue/", "/registry/"]


@pytest.mark.parametrize("path", PAGES)
def test_pages_send_anonymous_visitors_to_the_login_page(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


@pytest.mark.parametrize("path", PAGES)
def test_pages_refuse_annotators_naming_the_role(client_for, path):
    response = client_for("annotator").get(path)
    assert response.status_code == 403


@pytest.mark.parametrize("path", PAGES)
def test_pages_open_for_researchers_and_admins(client_for, path):
    assert client_for("researcher").get(path).status_code == 200
    assert client_for("admin").get(path).status_code == 200


def run_page_data(response, script_id: str = "run-data") -> dict:
    html = response.content.decode()
    start = html.index(f'<script id="{script_id}" type="application/json">') + len(
        f'<script id="{script_id}" type="application/json">'
    )
    return json.loads(html[start : html.index("</script>", start)])


def test_the_run_and_compare_pages_embed_the_metric_catalogue(researcher_client, experiment):
    run = make_run(experiment, state="running")
    for path in (f"/runs/{run.pk}/", "/compare/"):
        assert run_page_data(researcher_client.get(path), "metric-catalogue") == catalogue_json(), path


def test_run_page_embeds_the_seq_its_stream_resumes_from_and_the_logs_up_to_it(
    researcher_client, experiment, no_dispatch
):
    run = make_run(experiment, state="running")
    events_ingest(
        run.pk,
        [
            event(run, 1, "log", step=0, data={"level": "info", "message": "loading the policy"}),
            event(run, 2, "metrics", step=1, data={"reward/mean": 0.25}),
            event(run, 3, "log", step=1, data={"level": "warning", "message": "reward timed out"}),
        ],
    )
    response = researcher_client.get(f"/runs/{run.pk}/")
    assert response.status_code == 200
    data = run_page_data(response)
    assert data["id"] == str(run.pk)
    assert data["stream_from_seq"] == 3
    assert [(entry["seq"], entry["message"]) for entry in data["logs"]] == [
        (1, "loading the policy"),
        (3, "reward timed out"),
    ]
    assert data["total_steps"] == 2
    assert data["reward_names"] == ["exact_answer", "two-digits"]


def test_run_page_of_an_unknown_run_is_a_404(client_for):
    assert client_for("researcher").get("/runs/00000000-0000-0000-0000-000000000000/").status_code == 404


def test_run_page_escapes_user_text_in_the_embedded_data(researcher_client, experiment, no_dispatch):
    run = make_run(experiment, name="</script><script>alert(1)</script>")
    response = researcher_client.get(f"/runs/{run.pk}/")
    assert "<script>alert(1)</script>" not in response.content.decode()
    assert run_page_data(response)["name"] == "</script><script>alert(1)</script>"


def test_run_page_shows_what_the_run_needs_and_where_it_waits(researcher_client, experiment, no_dispatch):
    run = make_run(experiment, queue_position=2, queue_reason="needs 1 CPU, 0 free; 1 run ahead")
    html = researcher_client.get(f"/runs/{run.id}/").content.decode()
    assert '<span id="run-resources"' in html and ">1 CPU</span>" in html
    assert '#2 in the <a href="/queue/">queue</a>: needs 1 CPU, 0 free; 1 run ahead' in html
