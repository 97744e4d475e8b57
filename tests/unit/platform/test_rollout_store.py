"""The rollout store (posttrain.telemetry.rollouts): a bucket through fsspec (its memory filesystem), the export
as a dataset (`datasets.load_dataset("parquet")` and pandas), the migration that writes today's `Sample`
rows out as rollout files, and an engine killed while it writes a step's file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from posttrain.runs.models import RunState
from posttrain.telemetry import rollouts
from posttrain.telemetry.ingestion import events_ingest
from tests.unit.platform.helpers import make_run, sample_record, samples_event

pytestmark = pytest.mark.usefixtures("no_dispatch", "storage")


@pytest.fixture
def bucket(settings):
    settings.ROLLOUT_STORE = f"memory://bucket-{uuid.uuid4().hex[:8]}/posttrain"
    rollouts.reset_connections()  # the DuckDB connection registers the store's filesystem
    yield settings.ROLLOUT_STORE
    rollouts.reset_connections()


@pytest.mark.django_db
def test_a_bucket_store_is_written_queried_and_exported_through_fsspec(bucket, experiment, api):
    import fsspec

    run = make_run(experiment, RunState.RUNNING)
    events_ingest(
        run.id,
        [samples_event(run, 1, 1, [sample_record(i, reward=i / 4) for i in range(4)])],
    )
    fs, _ = fsspec.core.url_to_fs(bucket)
    assert fs.exists(f"{bucket}/runs/{run.id}/rollouts/step_00000001.parquet")
    page = api.get(f"/api/runs/{run.id}/samples/", {"min_reward": 0.5}).json()
    assert [r["index"] for r in page["results"]] == [2, 3] and page["count"] == 2 and page["gaps"] == []
    download = api.get(f"/api/runs/{run.id}/rollouts/step_00000001.parquet")
    assert download.status_code == 200 and b"".join(download.streaming_content)[:4] == b"PAR1"


@pytest.mark.django_db
def test_an_exported_run_loads_in_datasets_and_pandas(experiment, api, tmp_path):
    import pandas
    from datasets import load_dataset

    run = make_run(experiment, RunState.SUCCEEDED)
    events_ingest(run.id, [samples_event(run, step, step, [sample_record(i) for i in range(3)]) for step in (1, 2)])
    listing = api.get(f"/api/runs/{run.id}/rollouts/").json()
    for item in listing["files"]:
        response = api.get(f"/api/runs/{run.id}/rollouts/{item['name']}")
        (tmp_path / item["name"]).write_bytes(b"".join(response.streaming_content))
    files = sorted(str(p) for p in tmp_path.glob("step_*.parquet"))
    dataset = load_dataset("parquet", data_files=files, split="train", cache_dir=str(tmp_path / "cache"))
    assert dataset.num_rows == 6 and dataset[0]["prompt"] == "0+1=" and dataset[5]["step"] == 2
    frame = pandas.concat(pandas.read_parquet(f) for f in files)
    assert list(frame["index"]) == [0, 1, 2, 0, 1, 2] and frame["reward"].tolist() == [1.0] * 6


@pytest.mark.django_db(transaction=True)
def test_the_migration_writes_every_sample_row_out_as_rollout_files_and_drops_the_table(experiment, storage):
    from posttrain.telemetry.models import RolloutFile
    from posttrain_sdk.rollout_files import read_table

    run = make_run(experiment, RunState.SUCCEEDED)
    executor = MigrationExecutor(connection)
    before = [("runs", "0011_rollout_files"), ("review", "0001_initial")]
    executor.migrate(before)
    Sample = executor.loader.project_state(before).apps.get_model("runs", "Sample")
    rows = [
        Sample(
            run_id=run.id,
            seq=step + 10,
            step=step,
            index=i,
            group=i // 2,
            prompt=f"{i}+{step}=",
            response=str(i + step),
            label=str(i + step),
            reward=None if i == 3 else i / 2,
            components={"exact": 1.0},
            advantage=0.5,
            length=2,
            finish_reason="stop",
            errors=["boom"] if i == 1 else [],
            kept=i != 2,
            turns=[{"role": "assistant", "text": "x", "reward": None}] if i == 0 else [],
            env={"turns": 1} if i == 0 else {},
            tokens={"text": ["4", "2"], "advantage": "ADgAOA=="} if i == 0 else {},
        )
        for step in (1, 2)
        for i in range(4)
    ]
    Sample.objects.bulk_create(rows)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    with connection.cursor() as cursor:
        assert "runs_sample" not in connection.introspection.table_names(cursor)
    files = list(RolloutFile.objects.filter(run=run).order_by("step"))
    assert [(f.step, f.rows, f.seq) for f in files] == [(1, 4, 11), (2, 4, 12)]
    stored = read_table(storage / "runs" / str(run.id) / "rollouts" / files[0].name).to_pylist()
    assert [r["index"] for r in stored] == [0, 1, 2, 3]
    first = stored[0]
    assert (first["prompt"], first["response"], first["label"], first["reward"]) == ("0+1=", "1", "1", 0.0)
    assert first["turns"] == [{"role": "assistant", "text": "x", "reward": None}] and first["env"] == '{"turns": 1.0}'
    assert first["token_text"] == ["4", "2"] and first["token_advantage"] == [0.5, 0.5]
    assert stored[1]["errors"] == ["boom"] and stored[2]["kept"] is False and stored[3]["reward"] is None


# The engine's rollout writer in a process of its own: step 1 small, then big steps until it is killed.
KILLED_WRITER = """
import base64, os, sys
from pathlib import Path

run_dir, folder, run_id = sys.argv[1:4]
from posttrain_sdk.event_log import EventLog
from rl_engine.rollout_store import RolloutWriter, StepRollouts

def records(step, count, chars):
    text = lambda i: base64.b64encode(os.urandom(chars)).decode() if chars else str(i)
    return [
        {"index": i, "group": i // 8, "prompt": f"{i}+{step}=", "response": text(i), "reward": 1.0, "length": 2}
        for i in range(count)
    ]

writer = RolloutWriter(EventLog(Path(run_dir), run_id), folder)
writer.submit(StepRollouts(1, records(1, 4, 0), [], [], token_view=False))
writer.flush()
print("step 1 announced", flush=True)
for step in range(2, 1000):  # a big step at a time (about 24 MB of text) until the test kills this process
    writer.submit(StepRollouts(step, records(step, 2048, 9000), [], [], token_view=False))
"""


def kill_mid_write(process: subprocess.Popen, folder: Path, timeout_s: float = 120) -> Path:
    """SIGKILLs the writer while a step's file is half written: frozen (SIGSTOP) the moment its temporary
    file exists, and killed only if that file is still there (not yet renamed into place)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        partial = next(iter(folder.glob(".step_*.partial")), None)
        if partial is not None:
            os.kill(process.pid, signal.SIGSTOP)
            if partial.exists():
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
                return partial
            os.kill(process.pid, signal.SIGCONT)  # renamed in between: catch the next step
        if process.poll() is not None:
            raise AssertionError(f"the writer exited by itself: {process.stderr.read()}")
        time.sleep(0.0005)
    raise AssertionError("no step was caught mid-write")


@pytest.mark.django_db
def test_a_killed_engine_leaves_no_half_written_file_that_a_query_reads(experiment, api, tmp_path):
    import duckdb
    import pandas

    from posttrain_sdk.event_log import read_events
    from posttrain_sdk.rollout_files import parse_file_name, read_table

    run = make_run(experiment, RunState.RUNNING)
    folder = Path(rollouts.rollout_folder(run.id))
    repo = Path(__file__).resolve().parents[3]
    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path / "run"), str(folder), str(run.id)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "sdk")])},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout.readline().strip() == "step 1 announced"
        partial = kill_mid_write(writer, folder)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()

    # What the kill left: the half-written step as a hidden temporary file only, never under its step's name.
    killed_step = int(partial.name.split("_")[1][:8])
    assert parse_file_name(partial.name) is None and not (folder / f"step_{killed_step:08d}.parquet").exists()
    logged = read_events(tmp_path / "run" / "events.jsonl")
    events = [e for e in logged if e["type"] == "samples"]
    announced = [e["data"]["file"] for e in events]
    assert announced[0] == "step_00000001.parquet" and f"step_{killed_step:08d}.parquet" not in announced
    assert sorted(p.name for p in folder.glob("step_*.parquet")) == announced  # every whole file was announced
    for event in events:  # and is whole
        assert read_table(folder / event["data"]["file"], columns=["index"]).num_rows == event["data"]["rows"]

    # The platform's queries read the announced steps only, without an error, and name no gap.
    events_ingest(run.id, logged)
    page = api.get(f"/api/runs/{run.id}/samples/", {"step": 1}).json()
    assert [r["index"] for r in page["results"]] == [0, 1, 2, 3] and page["gaps"] == []
    everything = api.get(f"/api/runs/{run.id}/samples/", {"q": "1+1=", "limit": 500}).json()
    assert [(r["step"], r["index"]) for r in everything["results"]] == [(1, 1)]
    # So do readers outside Posttrain given the folder: DuckDB's glob and pandas skip the temporary file.
    total = sum(e["data"]["rows"] for e in events)
    assert duckdb.sql(f"SELECT count(*) FROM '{folder}/*.parquet'").fetchone() == (total,)
    assert len(pandas.read_parquet(folder, columns=["step"])) == total
