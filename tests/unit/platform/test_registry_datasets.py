"""Datasets: upload (JSONL, CSV, Parquet) or server-side path, validated, stored by content hash."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from posttrain.registry.models import Dataset
from posttrain.registry.services import dataset_upload
from tests.unit.platform.helpers import an_experiment, default_project, grant_server_paths

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _researcher_may_name_server_paths(researcher):
    """These tests register files on the server, which an admin grants (tests/security tries it without)."""
    grant_server_paths(researcher)


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def upload(client, content: bytes, filename: str = "data.jsonl", **fields):
    return client.post("/api/datasets/", {"file": SimpleUploadedFile(filename, content), **fields}, format="multipart")


ROWS = [{"prompt": f"{i}+{i}=", "label": str(2 * i)} for i in range(30)]


def test_uploading_a_jsonl_file_stores_it_by_content_hash_with_rows_and_preview(researcher_client, storage):
    content = jsonl(ROWS)
    response = upload(researcher_client, content, name="sums")
    assert response.status_code == 201, response.content
    body = response.json()
    sha = hashlib.sha256(content).hexdigest()
    assert body["sha256"] == sha
    assert body["format"] == "jsonl"
    assert body["row_count"] == 30
    assert body["columns"] == ["prompt", "label"]
    assert body["splits"] == {"train": 30}
    assert body["size_bytes"] == len(content)
    stored = storage / "datasets" / sha / "data.jsonl"
    assert body["path"] == str(stored)
    assert stored.read_bytes() == content
    assert not list((storage / "datasets" / ".incoming").iterdir())  # no temp file left

    preview = researcher_client.get(f"/api/datasets/{body['id']}/preview/").json()
    assert len(preview["rows"]) == 20
    assert preview["rows"][0] == ROWS[0]
    assert preview["row_count"] == 30


def test_reuploading_the_same_content_returns_the_existing_dataset(researcher_client):
    first = upload(researcher_client, jsonl(ROWS), name="first")
    again = upload(researcher_client, jsonl(ROWS), filename="copy.jsonl", name="second")
    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["name"] == "first"
    assert Dataset.objects.count() == 1


def test_a_split_column_is_counted_per_value(researcher_client):
    rows = [{"prompt": "p", "label": "l", "split": "train"}] * 3 + [{"prompt": "q", "label": "m", "split": "test"}] * 2
    body = upload(researcher_client, jsonl(rows)).json()
    assert body["splits"] == {"train": 3, "test": 2}


def test_field_mapping_names_the_prompt_and_label_columns(researcher_client):
    rows = [{"question": "2+2?", "answer": 4, "source": "gsm"}]
    body = upload(researcher_client, jsonl(rows), prompt_field="question", label_field="answer").json()
    assert (body["prompt_field"], body["label_field"], body["columns"]) == (
        "question",
        "answer",
        ["question", "answer", "source"],
    )


def test_a_dataset_without_labels_is_accepted_with_an_empty_label_field(researcher_client):
    body = upload(researcher_client, jsonl([{"prompt": "write a poem"}]), label_field="").json()
    assert body["label_field"] == "" and body["row_count"] == 1


def test_csv_upload_reads_the_header_and_rows(researcher_client):
    content = b'prompt,label\n"1+1=",2\n"say ""hi""",hi\n'
    body = upload(researcher_client, content, filename="d.csv").json()
    assert (body["format"], body["row_count"], body["columns"]) == ("csv", 2, ["prompt", "label"])
    preview = researcher_client.get(f"/api/datasets/{body['id']}/preview/").json()
    assert preview["rows"][1] == {"prompt": 'say "hi"', "label": "hi"}


def test_parquet_upload_reads_rows_in_batches(researcher_client):
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(
        pa.table({"prompt": [f"q{i}" for i in range(5000)], "label": list(range(5000))}), buffer, row_group_size=1000
    )
    body = upload(researcher_client, buffer.getvalue(), filename="d.parquet").json()
    assert (body["format"], body["row_count"], body["columns"]) == ("parquet", 5000, ["prompt", "label"])


def test_the_format_can_be_given_when_the_extension_does_not_say(researcher_client):
    response = upload(researcher_client, jsonl(ROWS), filename="export.txt", format="jsonl")
    assert response.status_code == 201
    assert response.json()["path"].endswith("/data.jsonl")


def test_datasets_filter_by_format_and_name(researcher_client):
    upload(researcher_client, jsonl(ROWS), name="sums-jsonl")
    upload(researcher_client, b"prompt,label\na,b\n", filename="x.csv", name="letters")
    names = lambda q: [d["name"] for d in researcher_client.get("/api/datasets/", q).json()["results"]]  # noqa: E731
    assert names({"format": "csv"}) == ["letters"]
    assert names({"name": "SUMS"}) == ["sums-jsonl"]
    assert "preview" not in researcher_client.get("/api/datasets/").json()["results"][0]


def test_a_file_over_the_size_limit_is_refused_naming_the_limit(researcher_client, settings):
    settings.DATASET_MAX_BYTES = 1000
    response = upload(researcher_client, jsonl(ROWS * 10))
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["loc"] == "file" and "size limit of 1000 bytes" in error["msg"]
    assert Dataset.objects.count() == 0


def test_the_size_limit_holds_while_streaming_even_if_the_declared_size_is_small(settings, tmp_path):
    settings.DATASET_MAX_BYTES = 100

    class Lying(SimpleUploadedFile):
        size = 10

    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as exc:
        dataset_upload("x", Lying("x.jsonl", jsonl(ROWS)), project=default_project())
    assert "size limit" in exc.value.message_dict["file"][0]


def test_registering_a_server_side_path_copies_it_into_the_store(researcher_client, tmp_path):
    source = tmp_path / "prompts.jsonl"
    source.write_bytes(jsonl(ROWS))
    response = researcher_client.post("/api/datasets/", {"path": str(source)}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["name"] == "prompts"
    source.write_text("changed later\n")
    assert Path(body["path"]).read_bytes() == jsonl(ROWS)


def test_errors_name_the_line_of_a_big_file_after_many_good_lines(researcher_client):
    content = jsonl(ROWS * 100) + b'{"prompt": "ok", "label": "1"}\n{"label": "no prompt"}\n'
    response = upload(researcher_client, content)
    assert response.status_code == 400
    assert response.json() == {
        "errors": [{"loc": "file", "msg": f"line {len(ROWS) * 100 + 2}: field 'prompt' is missing"}]
    }


def test_nul_characters_and_nan_are_kept_in_a_form_postgres_accepts(researcher_client):
    content = b'{"prompt": "a\\u0000b", "label": "x", "score": NaN, "k\\u0000": 1, "split": "t\\u0000"}\n'
    response = upload(researcher_client, content)
    assert response.status_code == 201, response.content
    assert response.json()["columns"] == ["prompt", "label", "score", "k\ufffd", "split"]
    assert response.json()["splits"] == {"t\ufffd": 1}
    row = researcher_client.get(f"/api/datasets/{response.json()['id']}/preview/").json()["rows"][0]
    assert row == {"prompt": "a\ufffdb", "label": "x", "score": "nan", "k\ufffd": 1, "split": "t\ufffd"}


def test_deleting_a_dataset_an_experiment_uses_is_refused_with_409(researcher_client):
    dataset = Dataset.objects.get(pk=upload(researcher_client, jsonl(ROWS)).json()["id"])
    an_experiment(dataset=dataset, name="needs-data")
    response = researcher_client.delete(f"/api/datasets/{dataset.pk}/")
    assert response.status_code == 409
    assert "needs-data" in response.json()["errors"][0]["msg"]


def test_deleting_an_unused_dataset_removes_its_stored_file(researcher_client, django_capture_on_commit_callbacks):
    body = upload(researcher_client, jsonl(ROWS)).json()
    with django_capture_on_commit_callbacks(execute=True):
        assert researcher_client.delete(f"/api/datasets/{body['id']}/").status_code == 204
    assert not Path(body["path"]).exists()


def test_format_query_parameter_filters_instead_of_choosing_the_renderer(researcher_client):
    upload(researcher_client, jsonl(ROWS))
    response = researcher_client.get("/api/datasets/?format=jsonl")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["count"] == 1
