"""Comparing runs: GET /api/compare/ (curves and summaries), /api/compare/prompts/ and /api/compare/samples/."""

from __future__ import annotations

import pytest

from posttrain.runs.models import Run, RunState
from posttrain.telemetry.ingestion import events_ingest
from tests.support.openapi import assert_documented
from tests.unit.platform.helpers import make_run, sample_record, samples_event, unknown_run_id

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]
T0 = 1_700_000_000.0


def metrics(run: Run, seq: int, step: int, data: dict) -> dict:
    return {"run": str(run.id), "seq": seq, "type": "metrics", "step": step, "time": T0 + step, "data": data}


def samples(run: Run, seq: int, step: int, records: list[dict]) -> dict:
    return samples_event(run, seq, step, records)


@pytest.fixture
def two_runs(experiment) -> tuple[Run, Run]:
    """Run a: steps 1..3, reward 0.1/0.2/0.3, 10 samples per step; run b: steps 1..2, reward 0.5/"nan", 20 per step."""
    a = make_run(experiment, RunState.SUCCEEDED)
    b = make_run(experiment, RunState.RUNNING, tags=["baseline"])
    events_ingest(
        a.id, [metrics(a, step, step, {"reward/mean": 0.1 * step, "progress/samples": 10 * step}) for step in (1, 2, 3)]
    )
    events_ingest(
        b.id,
        [
            metrics(b, 1, 1, {"reward/mean": 0.5, "progress/samples": 20, "kl/mean": 0.01}),
            metrics(b, 2, 2, {"reward/mean": "nan", "progress/samples": 40}),
        ],
    )
    a.refresh_from_db()
    b.refresh_from_db()
    return a, b


def compare(api, runs, **params):
    return api.get("/api/compare/", {"runs": runs, **params})


def test_compare_answers_each_run_in_the_order_given_with_its_curves(api, two_runs):
    a, b = two_runs
    response = compare(api, f"{b.id},{a.id}", names="reward/mean")
    assert response.status_code == 200
    body = response.json()
    assert body["x_axis"] == "step"
    assert [r["id"] for r in body["runs"]] == [str(b.id), str(a.id)]
    first = body["runs"][0]
    assert_documented(body, "/api/compare/")  # every field documented, none more
    assert (first["name"], first["experiment_name"], first["state"], first["tags"]) == (
        "sums grpo #2",
        "sums grpo",
        "running",
        ["baseline"],
    )
    assert first["config"] == b.resolved_config
    assert first["summary"]["reward/mean"] == {"last": None, "step": 2, "min": 0.5, "max": 0.5, "count": 2}
    assert first["series"] == {
        "reward/mean": {"x": [1, 2], "y": [0.5, None], "step": [1, 2], "points": 2, "downsampled": False}
    }
    assert body["runs"][1]["series"]["reward/mean"]["y"] == pytest.approx([0.1, 0.2, 0.3])


def test_compare_takes_runs_repeated_and_defaults_to_every_metric_of_any_run(api, two_runs):
    a, b = two_runs
    body = api.get(f"/api/compare/?runs={a.id}&runs={b.id}&runs={a.id}").json()
    assert [r["id"] for r in body["runs"]] == [str(a.id), str(b.id)]
    assert sorted(body["runs"][0]["series"]) == ["kl/mean", "progress/samples", "reward/mean"]
    assert body["runs"][0]["series"]["kl/mean"]["points"] == 0  # a never logged it


def test_compare_on_the_samples_axis_puts_each_run_on_its_own_progress(api, two_runs):
    a, b = two_runs
    body = compare(api, f"{a.id},{b.id}", names="reward/mean", x="samples").json()
    assert [r["series"]["reward/mean"]["x"] for r in body["runs"]] == [[10, 20, 30], [20, 40]]


def test_compare_downsamples_every_run(api, experiment):
    run = make_run(experiment, RunState.RUNNING)
    events_ingest(run.id, [metrics(run, i + 1, i, {"loss": float(i % 7)}) for i in range(50)])
    curve = compare(api, str(run.id), max_points=10).json()["runs"][0]["series"]["loss"]
    assert curve["downsampled"] is True and curve["points"] == 50 and len(curve["x"]) <= 10
    assert (curve["x"][0], curve["x"][-1]) == (0, 49)


@pytest.mark.parametrize(
    ("runs", "needle"),
    [
        (None, "required"),
        ("", "required"),
        ("not-a-uuid", "'not-a-uuid' is not a run id"),
        (unknown_run_id(), "no run with id"),
    ],
    ids=["none", "empty", "not-a-uuid", "unknown-run"],  # ids that every xdist worker collects alike
)
def test_compare_without_valid_runs_is_a_400_naming_runs(api, two_runs, runs, needle):
    params = {} if runs is None else {"runs": runs}
    response = api.get("/api/compare/", params)
    assert response.status_code == 400
    error = response.json()["errors"][0]
    assert error["loc"] == "runs" and needle in error["msg"]


def test_compare_with_an_unknown_run_among_known_ones_names_it(api, two_runs):
    missing = unknown_run_id()
    response = compare(api, f"{two_runs[0].id},{missing}")
    assert response.status_code == 400 and missing in response.json()["errors"][0]["msg"]


@pytest.mark.parametrize(("params", "loc"), [({"x": "epochs"}, "x"), ({"max_points": 5}, "max_points")])
def test_bad_compare_parameters_are_400_naming_them(api, two_runs, params, loc):
    response = compare(api, str(two_runs[0].id), **params)
    assert response.status_code == 400 and response.json()["errors"][0]["loc"] == loc


# --- prompts and samples -------------------------------------------------------------------------


@pytest.fixture
def sampled(experiment) -> tuple[Run, Run]:
    """Both runs sampled "2+2=" and "3+3="; only a sampled "1+1=". a: "3+3=" at steps 1 and 2 (twice each),
    "2+2=" at step 1; b: "2+2=" at step 5 (three times), "3+3=" at step 4."""
    a = make_run(experiment, RunState.RUNNING)
    b = make_run(experiment, RunState.RUNNING)
    events_ingest(
        a.id,
        [
            samples(
                a,
                1,
                1,
                [
                    sample_record(0, prompt="1+1="),
                    sample_record(1, prompt="2+2="),
                    sample_record(2, prompt="3+3="),
                    sample_record(3, prompt="3+3="),
                ],
            ),
            samples(a, 2, 2, [sample_record(0, prompt="3+3=", response="6"), sample_record(1, prompt="3+3=")]),
        ],
    )
    events_ingest(
        b.id,
        [
            samples(b, 1, 4, [sample_record(0, prompt="3+3=")]),
            samples(b, 2, 5, [sample_record(i, prompt="2+2=") for i in range(3)]),
        ],
    )
    return a, b


def test_prompts_every_run_sampled_come_most_recent_first_with_counts(api, sampled):
    a, b = sampled
    response = api.get("/api/compare/prompts/", {"runs": f"{a.id},{b.id}"})
    assert response.status_code == 200
    assert response.json() == {
        "prompts": [
            {"prompt": "2+2=", "counts": {str(a.id): 1, str(b.id): 3}, "truncated": {}},  # b stored its "2+2=" last
            {"prompt": "3+3=", "counts": {str(a.id): 4, str(b.id): 1}, "truncated": {}},
        ],
        "gaps": [],
    }


def test_prompts_filtered_by_text(api, sampled):
    a, b = sampled
    body = api.get("/api/compare/prompts/", {"runs": f"{a.id},{b.id}", "q": "3+"}).json()
    assert [p["prompt"] for p in body["prompts"]] == ["3+3="]
    assert api.get("/api/compare/prompts/", {"runs": str(a.id)}).json()["prompts"][-1]["prompt"] == "1+1="


def test_samples_of_a_prompt_show_each_runs_latest_step_with_it(api, sampled):
    a, b = sampled
    response = api.get("/api/compare/samples/", {"runs": f"{a.id},{b.id}", "prompt": "3+3="})
    assert response.status_code == 200
    runs = response.json()["runs"]
    assert [(r["id"], r["step"], [s["index"] for s in r["samples"]]) for r in runs] == [
        (str(a.id), 2, [0, 1]),
        (str(b.id), 4, [0]),
    ]
    assert runs[0]["samples"][0]["response"] == "6"
    assert set(runs[0]["samples"][0]) == {
        "run",
        "step",
        "index",
        "group",
        "prompt",
        "response",
        "label",
        "reward",
        "components",
        "advantage",
        "length",
        "finish_reason",
        "errors",
        "kept",
        "turns",
        "env",
        "truncated",
    }


def test_samples_of_a_prompt_at_a_given_step(api, sampled):
    a, b = sampled
    runs = api.get("/api/compare/samples/", {"runs": f"{a.id},{b.id}", "prompt": "3+3=", "step": 1}).json()["runs"]
    assert [(r["step"], len(r["samples"])) for r in runs] == [(1, 2), (1, 0)]
    never = api.get("/api/compare/samples/", {"runs": str(b.id), "prompt": "1+1="}).json()["runs"]
    assert never == [{"id": str(b.id), "step": None, "samples": []}]


@pytest.mark.parametrize(("params", "loc"), [({}, "prompt"), ({"prompt": "3+3=", "step": "last"}, "step")])
def test_bad_sample_comparison_parameters_are_400_naming_them(api, sampled, params, loc):
    response = api.get("/api/compare/samples/", {"runs": str(sampled[0].id), **params})
    assert response.status_code == 400 and response.json()["errors"][0]["loc"] == loc


def test_the_compare_endpoints_need_a_researcher(client, sampled):
    for url in ("/api/compare/", "/api/compare/prompts/", "/api/compare/samples/"):
        assert client.get(url, {"runs": str(sampled[0].id)}).status_code in (401, 403)
