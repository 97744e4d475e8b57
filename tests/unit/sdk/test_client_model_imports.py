"""`client.models.import_gguf` and `posttrain models import-gguf`, against a fake server (httpx's MockTransport): the
file goes up as a multipart upload with the project, a server path as JSON, and the import is followed at its `url`
until it ends; a failed import is an error naming why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from posttrain_sdk import APIError, Client

URL = "http://posttrain.test"
IMPORT_URL = "/api/models/imports/5b2d0f0e-8c1a-4a55-9a7b-3c9e0d1f2a3b/"


class ImportServer:
    """Answers the import with `states`, one per poll; records the requests."""

    def __init__(self, states: list[str], error: str = "") -> None:
        self.states, self.error = states, error
        self.requests: list[httpx.Request] = []

    def record(self, state: str) -> dict[str, Any]:
        model = {"id": 9, "name": "smol"} if state == "done" else None
        return {
            "id": "5b2d",
            "state": state,
            "url": IMPORT_URL,
            "error": self.error,
            "model": model,
            "source_name": "m.gguf",
        }

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        state = self.states.pop(0)
        return httpx.Response(202 if request.method == "POST" else 200, json=self.record(state))


def client_of(server: ImportServer) -> Client:
    return Client(URL, "t0ken", project="lab", transport=httpx.MockTransport(server))


@pytest.fixture
def gguf(tmp_path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 60)
    return path


def test_an_upload_sends_the_file_and_the_project_and_follows_the_import_until_it_is_done(gguf):
    server = ImportServer(["queued", "running", "done"])
    record = client_of(server).models.import_gguf(gguf, name="smol", poll_s=0)
    assert record["model"] == {"id": 9, "name": "smol"}
    post, *polls = server.requests
    assert post.url.path == "/api/models/import-gguf/" and post.headers["content-type"].startswith("multipart/")
    body = post.content.decode(errors="replace")
    assert 'name="project"\r\n\r\nlab' in body and 'name="name"\r\n\r\nsmol' in body and 'filename="m.gguf"' in body
    assert [p.url.path for p in polls] == [IMPORT_URL, IMPORT_URL]


def test_a_server_path_is_sent_as_json_and_a_failed_import_names_why():
    server = ImportServer(["queued", "failed"], error="unsupported architecture 'mamba'")
    with pytest.raises(APIError) as failed:
        client_of(server).models.import_gguf("/srv/models/m.gguf", server_path=True, poll_s=0)
    assert "unsupported architecture 'mamba'" in str(failed.value.errors[0])
    assert json.loads(server.requests[0].content) == {
        "name": "",
        "description": "",
        "project": "lab",
        "path": "/srv/models/m.gguf",
    }


def test_without_waiting_the_queued_import_comes_back(gguf):
    record = client_of(ImportServer(["queued"])).models.import_gguf(gguf, wait=False)
    assert record["state"] == "queued"
