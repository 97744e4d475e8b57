"""A run's prompt ledger through the API and the CLI's client: the per-epoch summary and the resumes read from
the file the engine keeps in the run's folder, the whole file as the export, and a clear 404 without one."""

from __future__ import annotations

import io

import pyarrow.parquet as pq
import pytest

from posttrain.runs.models import RunState
from posttrain.runs.services import run_dir_for
from rl_engine.ledger import LEDGER_FILE, Draw, PromptLedger, Resume, SampleOutcome
from tests.unit.platform.helpers import make_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]


def a_ledger() -> PromptLedger:
    ledger = PromptLedger(3)
    draws = [Draw(0, 0), Draw(0, 2)]
    ledger.draw(1, draws)
    ledger.resolve(1, draws, [SampleOutcome(0, True, None, (0, 0)), SampleOutcome(1, False, "zero_advantage", (0, 0))])
    ledger.draw(2, [Draw(0, 1)])
    ledger.resumes.append(Resume(1, 1, 0, [2], 1, 4.5))
    return ledger


def test_the_ledger_summary_counts_each_fate_per_epoch_and_lists_the_resumes(api, experiment):
    run = make_run(experiment, RunState.RUNNING)
    folder = run_dir_for(run.pk)
    folder.mkdir(parents=True)
    a_ledger().write_parquet(folder / LEDGER_FILE)

    body = api.get(f"/api/runs/{run.pk}/ledger/").json()

    assert body["epochs"] == [
        {
            "epoch": 0,
            "rows": 3,
            "trained": 1,
            "filtered": {"zero_advantage": 1},
            "dropped": {},
            "in_flight": 1,
            "not_drawn": 0,
            "skipped": 0,
            "duplicates": 0,
        }
    ]
    assert body["resumes"] == [
        {
            "checkpoint_step": 1,
            "restored_in_flight": 1,
            "lost_in_flight": 0,
            "redone_steps": [2],
            "redone_rows": 1,
            "seconds": 4.5,
        }
    ]
    assert body["totals"] == {
        "trained": 1,
        "filtered": 1,
        "dropped": 0,
        "in_flight": 1,
        "not_drawn": 0,
        "skipped": 0,
        "duplicates": 0,
    }


def test_the_whole_ledger_downloads_as_parquet_with_a_row_per_row_and_epoch(api, experiment):
    run = make_run(experiment, RunState.SUCCEEDED)
    folder = run_dir_for(run.pk)
    folder.mkdir(parents=True)
    a_ledger().write_parquet(folder / LEDGER_FILE)

    response = api.get(f"/api/runs/{run.pk}/ledger/file")

    assert response.status_code == 200
    table = pq.read_table(io.BytesIO(b"".join(response.streaming_content)))
    rows = sorted(zip(table["row"].to_pylist(), table["fate"].to_pylist(), table["reason"].to_pylist()))
    assert rows == [(0, "trained", ""), (1, "in_flight", ""), (2, "filtered", "zero_advantage")]


def test_a_run_without_a_ledger_is_a_404_that_says_why(api, experiment):
    run = make_run(experiment, RunState.QUEUED)
    for url in (f"/api/runs/{run.pk}/ledger/", f"/api/runs/{run.pk}/ledger/file"):
        response = api.get(url)
        assert response.status_code == 404
        assert "writes one after its first step" in response.json()["errors"][0]["msg"]


def test_a_ledger_over_the_size_bound_is_refused_before_it_is_read(api, experiment, settings):
    run = make_run(experiment, RunState.RUNNING)
    folder = run_dir_for(run.pk)
    folder.mkdir(parents=True)
    (folder / LEDGER_FILE).write_bytes(b"x" * 2048)  # not even Parquet: it must not be opened
    settings.LEDGER_MAX_BYTES = 1024
    response = api.get(f"/api/runs/{run.pk}/ledger/")
    assert response.status_code == 413
    assert "over the 1024 served" in response.json()["errors"][0]["msg"]
