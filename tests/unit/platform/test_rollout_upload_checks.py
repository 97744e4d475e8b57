"""An external run's uploaded rollout file is checked before it is put in place (posttrain.telemetry.rollout_checks):
Parquet whose footer reads, the rollout file's schema, rows and row groups within the bounds, every row's
texts and lists within the engine's bounds. Each refusal names the column (and the row or row group) and
leaves nothing in the store. An announced file is never replaced, and a run that ended takes no more files."""

from __future__ import annotations

import hashlib
import io
import os
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from posttrain.runs.models import RunState
from posttrain.telemetry.ingestion import events_ingest
from posttrain.telemetry.rollouts import rollout_folder
from posttrain_sdk import rollout_files
from tests.unit.platform.helpers import auth, event, make_run, sample_record

pytestmark = pytest.mark.django_db

PARQUET = "application/vnd.apache.parquet"
NAME = "step_00000001.parquet"


@pytest.fixture
def run(experiment):
    return make_run(experiment, RunState.RUNNING)


def rollout_file(records: list[dict] | None = None, step: int = 1, **columns) -> bytes:
    """A rollout file as the SDK writes it (records: helpers.sample_record's fields; columns: per-token lists)."""
    table = rollout_files.rows_table(records or [sample_record(0), sample_record(1)], step, columns)
    return rollout_files.encode(table)


def put(client, run, body: bytes, name: str = NAME):
    return client.put(f"/api/runs/{run.id}/rollouts/{name}/upload", data=body, content_type=PARQUET, **auth(run))


def stored(run) -> list[str]:
    """Every file in the run's rollout folder, hidden and partial ones included."""
    folder = Path(rollout_folder(run.id))
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def refusal(response) -> str:
    assert response.status_code == 400, response.content[:300]
    (error,) = response.json()["errors"]
    assert error["loc"] == "body"
    return error["msg"]


def test_a_rollout_file_within_the_bounds_is_put_in_place_byte_for_byte(client, run):
    body = rollout_file(token_text=[["4"], ["5", "!"]], entropy=[[0.5], [0.25, 0.125]])
    response = put(client, run, body)
    assert (response.status_code, response.json()) == (201, {"name": NAME, "bytes": len(body)})
    assert stored(run) == [NAME]
    assert (Path(rollout_folder(run.id)) / NAME).read_bytes() == body


def test_random_bytes_framed_as_parquet_are_refused_and_nothing_stays_in_the_store(client, run, storage):
    framed = b"PAR1" + os.urandom(4096) + b"PAR1"
    assert "not a " in refusal(put(client, run, framed))
    # A footer length that points past the file (or is huge) is refused before anything parses it.
    lying = b"PAR1" + os.urandom(64) + struct.pack("<I", 1 << 31) + b"PAR1"
    message = refusal(put(client, run, lying))
    assert "footer says it is 2147483648 bytes long" in message
    assert str(storage) not in message
    assert stored(run) == []


def test_a_parquet_file_of_other_columns_is_refused_naming_the_column(client, run):
    buffer = io.BytesIO()
    pq.write_table(pa.table({"step": pa.array([1], pa.int32()), "text": ["hello"]}), buffer)
    assert "it has no column 'index'" in refusal(put(client, run, buffer.getvalue()))

    table = rollout_files.rows_table([sample_record(0)], 1)
    wrong = table.set_column(table.schema.get_field_index("reward"), "reward", pa.array(["high"]))
    message = refusal(put(client, run, rollout_files.encode(wrong)))
    assert message == "not a rollout file: its column 'reward' is string, not double"
    extra = table.append_column("secret", pa.array([1]))
    assert "a column 'secret' that a rollout file does not have" in refusal(
        put(client, run, rollout_files.encode(extra))
    )
    assert stored(run) == []


def test_a_rollout_with_more_token_pieces_than_the_engine_makes_is_refused_naming_the_row(client, run):
    too_many = rollout_files.MAX_ROLLOUT_TOKENS + 1
    body = rollout_file(token_text=[["a"], ["b"] * too_many])
    message = refusal(put(client, run, body))
    assert message == f"row 1 (index 1): token_text is {too_many} values; at most {rollout_files.MAX_ROLLOUT_TOKENS}"
    assert stored(run) == []


def test_too_many_errors_too_long_a_text_or_json_that_is_no_object_are_refused(client, run):
    errors = [sample_record(0), sample_record(1, errors=[f"error {i}" for i in range(rollout_files.MAX_ERRORS + 1)])]
    assert refusal(put(client, run, rollout_file(errors))) == (
        f"row 1 (index 1): errors is {rollout_files.MAX_ERRORS + 1} errors; at most {rollout_files.MAX_ERRORS}"
    )
    long = [sample_record(0, response="x" * (rollout_files.MAX_TEXT_BYTES + 1))]
    assert refusal(put(client, run, rollout_file(long))).startswith(
        f"row 0 (index 0): response is {rollout_files.MAX_TEXT_BYTES + 1} bytes"
    )
    table = rollout_files.rows_table([sample_record(0)], 1)
    not_json = table.set_column(table.schema.get_field_index("components"), "components", pa.array(["[1, 2"]))
    assert refusal(put(client, run, rollout_files.encode(not_json))) == (
        "row 0 (index 0): components is not the text of a JSON object"
    )
    assert stored(run) == []


def test_a_row_within_each_columns_bound_but_over_the_row_bound_is_refused(client, run):
    text = "y" * rollout_files.MAX_TEXT_BYTES  # each text at its own bound: four of them are more than a row holds
    record = sample_record(0, prompt=text, response=text, label=text, turns=[{"role": "user", "text": text}])
    message = refusal(put(client, run, rollout_file([record])))
    assert message.startswith("row 0 (index 0): the row is ") and message.endswith(
        f"bytes; at most {rollout_files.MAX_ROW_BYTES}"
    )


def test_rows_of_another_step_than_the_files_name_are_refused(client, run):
    body = rollout_file(step=1)
    assert refusal(put(client, run, body, name="step_00000002.parquet")) == (
        "row 0 (index 0): step is not 2, the file name's"
    )


def test_a_row_group_over_the_bounds_is_refused_and_the_sdk_writer_splits_the_same_rows(client, run):
    tokens = 250_000  # within a rollout's bound; 20 of them are more list values than one row group may hold
    records = [sample_record(i) for i in range(20)]
    table = rollout_files.rows_table(records, 1, {"token_ids": [list(range(tokens))] * 20})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=1024)  # one row group
    message = refusal(put(client, run, buffer.getvalue()))
    assert message.startswith(f"column 'token_ids' holds {20 * tokens} values in row group 0 (20 rows)")

    written = rollout_files.encode(table)
    assert pq.ParquetFile(io.BytesIO(written)).metadata.num_row_groups > 1
    assert put(client, run, written).status_code == 201


def test_an_announced_file_is_never_replaced_and_an_unannounced_one_may_be_sent_again(client, run):
    first, second = rollout_file(), rollout_file([sample_record(0, response="changed")])
    assert put(client, run, first).status_code == 201
    assert put(client, run, first).status_code == 201  # a client's retry before its samples event
    data = {"file": NAME, "part": 0, "rows": 2, "bytes": len(first), "sha256": hashlib.sha256(first).hexdigest()}
    events_ingest(run.id, [event(run, 1, "samples", 1, {**data, "stats": {}})])

    response = put(client, run, second)
    assert response.status_code == 409
    assert response.json()["errors"] == [
        {
            "loc": "name",
            "msg": f"{NAME} is announced already (a samples event named it): an announced rollout file is never replaced",
        }
    ]
    assert (Path(rollout_folder(run.id)) / NAME).read_bytes() == first
    assert stored(run) == [NAME]


def test_a_run_that_ended_takes_no_more_rollout_files(client, experiment):
    ended = make_run(experiment, RunState.SUCCEEDED)
    response = put(client, ended, rollout_file())
    assert response.status_code == 409
    assert response.json()["state"] == "succeeded"
    assert "has ended (succeeded): it takes no more rollout files" in response.json()["errors"][0]["msg"]
    assert stored(ended) == []
