"""What the runs list shows per run: its algorithm, model, dataset and metric summary, in a constant
number of queries however many runs the page holds."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from posttrain.registry.models import Dataset, ModelAsset
from posttrain.runs.models import Experiment, Run, RunState
from tests.support.openapi import assert_documented
from tests.unit.platform.helpers import make_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]

SUMMARY = {
    "reward/mean": {"last": 0.62, "step": 40, "min": 0.1, "max": 0.71, "count": 40},
    "eval/reward/mean": {"last": 0.55, "step": 40, "min": 0.2, "max": 0.58, "count": 5},
}


def test_each_listed_run_names_its_algorithm_model_dataset_and_summary(api, experiment):
    run = make_run(experiment, RunState.RUNNING, summary=SUMMARY)
    response = api.get("/api/runs/")
    assert response.status_code == 200
    (listed,) = response.json()["results"]
    assert listed["id"] == str(run.id)
    assert (listed["algorithm"], listed["model_name"], listed["dataset_name"]) == ("grpo", "tiny", "sums")
    assert listed["summary"] == SUMMARY
    assert_documented(response.json(), "/api/runs/")  # every field documented, none more


def test_a_run_never_launched_has_no_algorithm(api, experiment):
    Run.objects.create(experiment=experiment, state=RunState.DRAFT)
    (listed,) = api.get("/api/runs/").json()["results"]
    assert listed["algorithm"] is None and listed["summary"] == {}


def test_the_run_detail_carries_the_same_fields_and_the_resolved_config(api, experiment):
    run = make_run(experiment, RunState.RUNNING, summary=SUMMARY)
    detail = api.get(f"/api/runs/{run.id}/").json()
    assert detail["algorithm"] == "grpo" and detail["summary"] == SUMMARY
    assert detail["resolved_config"]["algorithm"]["name"] == "grpo"


def test_listing_more_runs_takes_no_more_queries(api, experiment, registry):
    make_run(experiment, RunState.RUNNING)

    def queries_of_a_list() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert api.get("/api/runs/").status_code == 200
        return len(captured)

    one = queries_of_a_list()
    for i in range(3):  # each run on its own experiment, model and dataset
        model = ModelAsset.objects.create(name=f"model-{i}", path="/nonexistent")
        dataset = Dataset.objects.create(
            name=f"data-{i}", sha256=f"{i}" * 64, format="jsonl", path="/nonexistent", size_bytes=1, row_count=1
        )
        other = Experiment.objects.create(name=f"exp-{i}", model=model, dataset=dataset, config={})
        Run.objects.create(experiment=other, state=RunState.SUCCEEDED, summary=SUMMARY)
    assert queries_of_a_list() == one
    names = {r["model_name"] for r in api.get("/api/runs/").json()["results"]}
    assert names == {"tiny", "model-0", "model-1", "model-2"}


def test_id_prefix_finds_the_runs_whose_id_starts_with_it(api, experiment):
    import uuid

    ids = ["3f2a1b9c-0000-4000-8000-000000000001", "3f2a1b9c-ffff-4fff-bfff-ffffffffffff", "3f2b0000-0000-4000-8000-0"]
    ids[2] += "0" * (36 - len(ids[2]))
    for i, run_id in enumerate(ids):
        Run.objects.create(id=uuid.UUID(run_id), experiment=experiment, name=f"run {i}", state=RunState.SUCCEEDED)

    def found(prefix: str) -> list[str]:
        response = api.get("/api/runs/", {"id_prefix": prefix})
        assert response.status_code == 200, response.json()
        return sorted(r["id"] for r in response.json()["results"])

    assert found("3f2a1b9c") == ids[:2]  # a short id, as the CLI shows it
    assert found("3F2A") == ids[:2]  # hex digits in either case
    assert found("3f2a1b9c-ffff") == [ids[1]] == found("3f2a1b9cffff")  # dashes optional
    assert found("3f2") == ids
    assert found(ids[2]) == [ids[2]]  # a whole id is its own prefix
    assert found("0") == []


@pytest.mark.parametrize("prefix", ["xyz", "3f2a/..", "0" * 33, "-"])
def test_an_id_prefix_that_is_no_start_of_an_id_is_refused_naming_the_parameter(api, prefix):
    response = api.get("/api/runs/", {"id_prefix": prefix})
    assert response.status_code == 400
    (error,) = response.json()["errors"]
    assert error["loc"] == "id_prefix" and "hex digits" in error["msg"]
