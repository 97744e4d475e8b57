"""An external run's rollout files on the real stack: the SDK writes each step's file and its sender uploads
it (`PUT /api/runs/<id>/rollouts/<name>/upload`, the run's token) to uvicorn on the test database before it
posts the `samples` event that names it. An upload is refused, and nothing lands in the store, for another
run's token, a name outside the run's rollout files, a body that is not Parquet and a body over the limit;
a refused file does not hold the run's other events back, and its step is named as missing."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import random
import re
import string
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.stack import UvicornServer, postgres_url

pytestmark = pytest.mark.django_db(transaction=True)

UPLOAD_LIMIT = 256 * 1024  # bytes: small, so an oversize file is quick to make


@dataclass
class Web:
    server: UvicornServer
    store: Path  # the server's rollout store (POSTTRAIN_ROLLOUT_STORE)

    @property
    def url(self) -> str:
        return self.server.url

    def folder(self, run_id: str) -> Path:
        return self.store / "runs" / run_id / "rollouts"


@pytest.fixture(scope="module")
def web(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Web]:
    from django.conf import settings
    from django.db import connection

    home = tmp_path_factory.mktemp("upload-web")
    store = home / "rollout-store"
    env = {
        **os.environ,
        "DATABASE_URL": postgres_url(connection.settings_dict),
        "POSTTRAIN_HOME": str(home),
        "POSTTRAIN_ROLLOUT_STORE": str(store),
        "POSTTRAIN_ROLLOUT_UPLOAD_MAX_BYTES": str(UPLOAD_LIMIT),
        "POSTTRAIN_SECRET_KEY": settings.SECRET_KEY,  # run tokens minted here are the server's
        "PYTHONUNBUFFERED": "1",
    }
    server = UvicornServer(env, home / "uvicorn.log")
    server.start()
    try:
        yield Web(server, store)
    finally:
        server.stop()


@pytest.fixture
def token(db) -> str:
    from posttrain.accounts.services import token_get_or_create
    from tests.unit.platform.helpers import a_researcher

    return token_get_or_create(a_researcher("ada")).key  # a member of the default project, her only one


def rows(step: int, count: int = 4, chars: int = 20) -> list[dict]:
    """`count` rollouts of `chars` random letters each (random text barely compresses)."""
    rng = random.Random(step)
    return [
        {
            "prompt": f"{step}+{i}=",
            "response": "".join(rng.choices(string.ascii_letters + " ", k=chars)),
            "reward": float(i % 2),
            "group": i // 2,
        }
        for i in range(count)
    ]


def parquet_bytes(step: int) -> bytes:
    from posttrain_sdk import rollout_files

    records = [{**r, "index": i, "length": len(r["response"])} for i, r in enumerate(rows(step))]
    return rollout_files.encode(rollout_files.rows_table(records, step))


def put(web: Web, run_id: str, name: str, body: bytes, token: str, *, chunked: bool = False) -> tuple[int, dict]:
    """One upload as a client sends it: with Content-Length, or in chunks without one."""
    connection = http.client.HTTPConnection(urllib.parse.urlsplit(web.url).hostname, web.server.port, timeout=60)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/vnd.apache.parquet"}
    try:
        if chunked:
            connection.request(
                "PUT", f"/api/runs/{run_id}/rollouts/{name}/upload", iter([body]), headers, encode_chunked=True
            )
        else:
            connection.request("PUT", f"/api/runs/{run_id}/rollouts/{name}/upload", body, headers)
        response = connection.getresponse()
        text = response.read()
        is_json = response.getheader("Content-Type", "").startswith("application/json")
        return response.status, json.loads(text) if is_json else {"text": text.decode("utf-8", "replace")}
    finally:
        connection.close()


def files_under(folder: Path) -> list[str]:
    """Every file below `folder` (hidden and partial ones included), relative to it."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir()) if folder.exists() else []


def test_the_sdk_uploads_each_steps_file_before_its_event_and_the_store_holds_it_byte_for_byte(web, token, tmp_path):
    import posttrain_sdk as posttrain
    from posttrain.telemetry.models import RolloutFile

    run = posttrain.init("uploads", url=web.url, token=token, dir=tmp_path, heartbeat_s=0)
    for step in (1, 2, 3):
        run.log({"reward/mean": 0.5}, step=step)
        assert run.log_samples(rows(step), step=step) == 4
    run.log_samples(rows(30, count=2), step=3)  # a second batch of step 3: a second file, part 1
    assert run.finish(timeout_s=60)

    local = run.dir / "rollouts"
    names = ["step_00000001.parquet", "step_00000002.parquet", "step_00000003.parquet", "step_00000003.1.parquet"]
    assert sorted(p.name for p in local.iterdir()) == sorted(names)
    # The platform's copy is the SDK's file, byte for byte, and the index row says so.
    assert files_under(web.folder(run.id)) == sorted(names)
    for name in names:
        assert (web.folder(run.id) / name).read_bytes() == (local / name).read_bytes(), name
    indexed = {f.name: f for f in RolloutFile.objects.filter(run_id=run.id)}
    assert sorted(indexed) == sorted(names)
    for name, row in indexed.items():
        assert row.sha256 == hashlib.sha256((local / name).read_bytes()).hexdigest()
        assert row.bytes == (local / name).stat().st_size
    assert (indexed["step_00000003.1.parquet"].step, indexed["step_00000003.1.parquet"].rows) == (3, 2)

    client = posttrain.Client(web.url, token)
    assert len(client.runs.samples(run.id)) == 14
    assert [(s.index, s.response) for s in client.runs.samples(run.id, step=3)][-2:] == [
        (4, rows(30, count=2)[0]["response"]),
        (5, rows(30, count=2)[1]["response"]),
    ]
    exported = client.runs.rollouts(run.id, tmp_path / "export")
    assert sorted(p.name for p in exported) == sorted(names)
    assert all(p.read_bytes() == (local / p.name).read_bytes() for p in exported)


def test_an_upload_is_refused_for_another_runs_token_a_foreign_name_a_body_not_parquet_or_over_the_limit(
    web, token, tmp_path
):
    import posttrain_sdk as posttrain
    from posttrain.core.run_tokens import ingest_token

    run = posttrain.init("refusals", url=web.url, token=token, dir=tmp_path / "a", heartbeat_s=0)
    other = posttrain.init("another run", url=web.url, token=token, dir=tmp_path / "b", heartbeat_s=0)
    mine, theirs = ingest_token(run.id), ingest_token(other.id)
    good = parquet_bytes(1)

    status, body = put(web, run.id, "step_00000001.parquet", good, theirs)
    assert status == 403 and body["errors"][0]["msg"] == "this token is not valid for this run"
    status, body = put(web, run.id, "step_00000001.parquet", good, "not-a-token")
    assert status == 403

    # Only the run's own rollout file names: not its event log, its config, a path or a hidden file.
    for name in ("events.jsonl", "config.yaml", ".step_00000001.parquet.partial", "step_1.parquet"):
        status, body = put(web, run.id, name, good, mine)
        assert (status, body["errors"][0]["loc"]) == (400, "name"), name
    for name in ("..%2Fevents.jsonl", "..%2F..%2F" + other.id + "%2Frollouts%2Fstep_00000001.parquet"):
        status, body = put(web, run.id, name, good, mine)
        assert status == 404, (name, status, body)  # a slash is never part of a name: no route takes it

    # Not Parquet: a CSV, an empty body, a file cut short (a client killed mid-upload).
    for bad in (b"step,reward\n1,0.5\n", b"", good[: len(good) // 2]):
        status, body = put(web, run.id, "step_00000001.parquet", bad, mine)
        assert status == 400 and body["errors"][0]["loc"] == "body", bad[:20]
        assert "not a Parquet file" in body["errors"][0]["msg"]

    # Over the limit, whether the client declares its length or streams it in chunks.
    oversize = good[:4] + os.urandom(UPLOAD_LIMIT) + good[-4:]
    for chunked in (False, True):
        status, body = put(web, run.id, "step_00000001.parquet", oversize, mine, chunked=chunked)
        assert status == 413 and f"at most {UPLOAD_LIMIT} bytes" in body["errors"][0]["msg"], chunked

    # Nothing of any refused upload is anywhere in the store (no file, no partial file, nothing outside).
    assert files_under(web.store / "runs" / run.id) == files_under(web.store / "runs" / other.id) == []
    assert all(
        re.fullmatch(r"runs/[0-9a-f-]{36}/rollouts/step_\d{8}(\.\d+)?\.parquet", f) for f in files_under(web.store)
    )
    status, body = put(web, run.id, "step_00000001.parquet", good, mine)
    assert (status, body) == (201, {"name": "step_00000001.parquet", "bytes": len(good)})
    assert files_under(web.store / "runs" / run.id) == ["rollouts/step_00000001.parquet"]
    run.finish(timeout_s=30)
    other.finish(timeout_s=30)


def test_a_refused_file_does_not_hold_back_the_runs_events_and_its_step_is_named_missing(web, token, tmp_path, capfd):
    import posttrain_sdk as posttrain

    run = posttrain.init("too big", url=web.url, token=token, dir=tmp_path, heartbeat_s=0)
    run.log_samples(rows(1), step=1)
    run.log_samples(rows(2, count=64, chars=8000), step=2)  # random text: compresses to more than the limit
    run.log_samples(rows(3), step=3)
    for step in (1, 2, 3):
        run.log({"reward/mean": float(step)}, step=step)
    assert (run.dir / "rollouts" / "step_00000002.parquet").stat().st_size > UPLOAD_LIMIT
    assert run.finish(timeout_s=60)  # every event delivered, the refused file's included
    assert "the platform refused the rollout file step_00000002.parquet (HTTP 413)" in capfd.readouterr().err

    client = posttrain.Client(web.url, token)
    assert client.runs.metrics(run.id, ["reward/mean"])["reward/mean"]["steps"] == [1, 2, 3]
    assert files_under(web.folder(run.id)) == ["step_00000001.parquet", "step_00000003.parquet"]
    page = client.get(f"/api/runs/{run.id}/samples/")
    assert [gap["step"] for gap in page["gaps"]] == [2] and "never arrived" in page["gaps"][0]["reason"]
    assert sorted({s["step"] for s in page["results"]}) == [1, 3]
