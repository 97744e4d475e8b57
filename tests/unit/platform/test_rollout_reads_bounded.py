"""Every read of rollout files is bounded and survives a bad file: lists and texts are cut in the query and the
answer says so (`truncated`: the full length), and a file a query cannot read is a gap naming it in the
samples, the per-token view, compare and campaign creation, never a 500."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from posttrain.telemetry import rollouts
from posttrain.telemetry.rollouts import rollout_folder
from tests.unit.platform.helpers import PASS_FAIL, run_with_samples, sample

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]

BROKEN = "step_00000002.parquet"


def steps(prompt: str = "2+2=") -> dict[int, list[dict]]:
    return {step: [sample(i, 1.0, prompt, f"{step}.{i}", group=0) for i in range(3)] for step in (1, 2)}


def break_file(run, name: str = BROKEN, body: bytes | None = None) -> None:
    """Overwrite an announced file in the store (an old upload, a damaged disk): random bytes framed as Parquet."""
    (Path(rollout_folder(run.id)) / name).write_bytes(body or b"PAR1" + os.urandom(2048) + b"PAR1")


def test_a_rollout_with_100k_token_pieces_answers_a_bounded_body_that_says_it_was_cut(api, experiment):
    pieces = 100_000
    record = sample(0, 1.0, "q", "r", token_text=["tok"] * pieces, entropy=[0.5] * pieces)
    run = run_with_samples(experiment, {1: [record]})
    response = api.get(f"/api/runs/{run.id}/sample-tokens/", {"step": 1, "index": 0})
    assert response.status_code == 200
    assert len(response.content) < 100_000  # the 100k pieces alone would be 700 kB of JSON
    tokens = response.json()["tokens"]
    assert len(tokens["text"]) == rollouts.MAX_VIEW_TOKENS
    assert tokens["truncated"] == {"token_text": pieces, "entropy": pieces}


def test_long_texts_and_lists_are_cut_in_the_query_and_the_page_says_by_how_much(api, experiment):
    record = sample(0, 1.0, "q" * 50_000, "r" * 100_000, errors=["e" * 5000] * 60)
    run = run_with_samples(experiment, {1: [record]})
    response = api.get(f"/api/runs/{run.id}/samples/")
    assert response.status_code == 200
    assert len(response.content) < 100_000
    (row,) = response.json()["results"]
    assert len(row["prompt"]) == len(row["response"]) == rollouts.TEXT_CHARS
    assert len(row["errors"]) == rollouts.ERRORS_SHOWN and {len(e) for e in row["errors"]} == {rollouts.ERROR_CHARS}
    assert row["truncated"] == {"prompt": 50_000, "response": 100_000, "errors": 60, "errors.text": 5000}


def test_a_file_holding_more_list_values_than_its_rows_may_is_a_gap_and_its_lists_are_never_read(api, experiment):
    """An upload from before the checks: 7,000 errors in one rollout (the attack had 7 million). Its footer
    says so; the pages that read the lists leave it out, those that do not still read it."""
    flood = sample(0, 1.0, "q", "r", errors=["boom"] * 7000, token_text=["t"] * 300_000)
    run = run_with_samples(experiment, {1: [sample(0, 1.0, "q", "fine")], 2: [flood]})
    body = api.get(f"/api/runs/{run.id}/samples/").json()
    assert [(r["step"], r["response"]) for r in body["results"]] == [(1, "fine")]
    (gap,) = body["gaps"]
    assert (gap["step"], gap["file"]) == (2, BROKEN)
    assert gap["reason"].endswith(
        "its column 'errors' holds 7000 values in 1 rows (row group 0); a rollout holds at most 64"
    )
    assert api.get(f"/api/runs/{run.id}/samples/", {"min_reward": 0.5}).json()["count"] == 2  # no list read
    tokens = api.get(f"/api/runs/{run.id}/sample-tokens/", {"step": 2, "index": 0})
    assert tokens.status_code == 404 and "holds 300000 values" in tokens.json()["errors"][0]["msg"]


def test_an_unreadable_file_is_a_gap_of_the_samples_and_of_the_per_token_view(api, experiment, storage):
    run = run_with_samples(experiment, steps())
    break_file(run)
    for params in ({}, {"min_reward": 0.5}, {"q": "."}, {"prompt": "2+2="}):
        response = api.get(f"/api/runs/{run.id}/samples/", params)
        assert response.status_code == 200, params
        body = response.json()
        assert [(r["step"], r["index"]) for r in body["results"]] == [(1, 0), (1, 1), (1, 2)], params
        (gap,) = body["gaps"]
        assert (gap["step"], gap["file"]) == (2, BROKEN)
        assert gap["reason"].startswith(f"its rollout file {BROKEN} cannot be read: not a ")
        assert str(storage) not in response.content.decode()
    assert api.get(f"/api/runs/{run.id}/samples/", {"min_reward": 0.5}).json()["count"] == 3

    broken = api.get(f"/api/runs/{run.id}/sample-tokens/", {"step": 2, "index": 0})
    assert broken.status_code == 404 and BROKEN in broken.json()["errors"][0]["msg"]
    fine = api.get(f"/api/runs/{run.id}/sample-tokens/", {"step": 1, "index": 0})
    assert fine.status_code == 200
    assert fine.json()["same_prompt"] == [{"step": 1, "index": i} for i in range(3)]
    assert [g["file"] for g in fine.json()["gaps"]] == [BROKEN]


def test_a_parquet_file_without_the_rollout_columns_is_a_gap_naming_what_it_lacks(api, experiment):
    run = run_with_samples(experiment, steps())
    pq.write_table(pa.table({"step": pa.array([2], pa.int32())}), Path(rollout_folder(run.id)) / BROKEN)
    body = api.get(f"/api/runs/{run.id}/samples/").json()
    assert len(body["results"]) == 3
    assert body["gaps"][0]["reason"].startswith(f"its rollout file {BROKEN} cannot be read: it has no column 'index'")


def test_compare_answers_from_the_readable_files_and_names_the_others(api, experiment):
    first, second = run_with_samples(experiment, steps(), name="a"), run_with_samples(experiment, steps(), name="b")
    break_file(second)
    runs = f"{first.id},{second.id}"
    prompts = api.get("/api/compare/prompts/", {"runs": runs})
    assert prompts.status_code == 200
    assert prompts.json()["prompts"] == [
        {"prompt": "2+2=", "counts": {str(first.id): 6, str(second.id): 3}, "truncated": {}}
    ]
    assert [(g["run"], g["file"]) for g in prompts.json()["gaps"]] == [(str(second.id), BROKEN)]
    samples = api.get("/api/compare/samples/", {"runs": runs, "prompt": "2+2="})
    assert samples.status_code == 200
    assert [(r["step"], len(r["samples"])) for r in samples.json()["runs"]] == [(2, 3), (1, 3)]
    assert [(g["run"], g["file"]) for g in samples.json()["gaps"]] == [(str(second.id), BROKEN)]


def test_another_users_campaign_over_a_run_with_an_unreadable_file_is_made_from_the_others(
    client_for, experiment, make_user
):
    run = run_with_samples(experiment, steps())
    break_file(run)
    annotator = make_user("annotator", "ann")
    body = {
        "name": "review",
        "kind": "single",
        "questions": PASS_FAIL,
        "source": {"runs": [str(run.id)], "rule": "random", "k": 2, "seed": 1},
        "annotators": [annotator.username],
    }
    other = client_for("researcher")  # not the run's owner
    response = other.post("/api/review/campaigns/", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 201, response.content[:500]
    campaign = response.json()
    assert campaign["item_count"] == 2
    assert [(g["step"], g["file"], g["run"]) for g in campaign["gaps"]] == [(2, BROKEN, str(run.id))]
