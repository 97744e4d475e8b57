"""GGUF models imported into the registry (POST /api/models/import-gguf/): an upload or a server file becomes an
import that the user-code worker converts in the engine's sandbox into a model of the models store, registered with
its provenance; each refusal names what and where, and no staging folder outlives its import."""

from __future__ import annotations

import hashlib
import importlib
import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from posttrain.registry.models import ModelAsset, ModelImport
from tests.support.gguf_files import write_tiny_gguf
from tests.unit.platform.helpers import default_project, grant_server_paths

pytestmark = pytest.mark.django_db

imports = importlib.import_module("posttrain.registry.services.model_imports")
uploads = importlib.import_module("posttrain.registry.gguf_uploads")
sandbox = importlib.import_module("rl_engine.sandbox")
needs_sandbox = pytest.mark.skipif(not sandbox.status().available, reason=f"no sandbox: {sandbox.status().detail}")


@pytest.fixture(autouse=True)
def imports_run_here(monkeypatch, settings):
    """The worker's service runs right away in this process (these tests run in one transaction, so nothing is
    sent after commit); the conversion still runs in the sandbox. vLLM's check is off, as in every test."""
    monkeypatch.setattr(imports, "_dispatch", lambda record: imports.model_import_run(record.pk))
    settings.GGUF_IMPORT_CHECK_VLLM = False
    settings.GGUF_IMPORT_DTYPE = "float32"
    settings.GGUF_IMPORT_MEMORY_MB = 4096
    settings.GGUF_IMPORT_CPUS = 1


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gguf")  # inside the tests' import root
    return {arch: write_tiny_gguf(folder / f"tiny-{arch}.gguf", arch) for arch in ("llama", "qwen2")}


def upload(client, path: Path, **fields):
    with path.open("rb") as handle:
        return client.post("/api/models/import-gguf/", {"file": handle, **fields}, format="multipart")


def staging_left() -> list[str]:
    root = uploads.staging_root()
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


@needs_sandbox
def test_an_uploaded_gguf_becomes_a_model_with_its_provenance(
    researcher_client, tiny, storage, django_capture_on_commit_callbacks
):
    response = upload(researcher_client, tiny["llama"], name="tiny", description="from llama.cpp")
    assert response.status_code == 202, response.content
    record = response.json()
    assert record["source_name"] == "tiny-llama.gguf" and record["url"] == f"/api/models/imports/{record['id']}/"
    polled = researcher_client.get(record["url"]).json()
    assert polled["state"] == "done", polled["error"]
    model = polled["model"]
    assert model["name"] == "tiny" and model["source"] == "gguf" and model["architecture"] == "LlamaForCausalLM"
    assert model["description"] == "from llama.cpp" and model["parameter_count"] == 26_976
    provenance = model["provenance"]
    assert provenance["sha256"] == hashlib.sha256(tiny["llama"].read_bytes()).hexdigest() == polled["sha256"]
    assert provenance["source_file"] == "tiny-llama.gguf" and provenance["architecture"] == "llama"
    assert provenance["quantization"] == {"Q8_0": 15, "F32": 5} and provenance["dtype"] == "float32"
    assert provenance["check"]["tokens"] == 8 and provenance["vllm_check"] is None
    folder = Path(model["path"])
    assert folder.parent == storage / "models" and (folder / "model.safetensors").is_file()
    assert researcher_client.get(f"/api/models/{model['id']}/").json()["provenance"] == provenance
    assert staging_left() == []
    with django_capture_on_commit_callbacks(execute=True):
        assert researcher_client.delete(f"/api/models/{model['id']}/").status_code == 204
    assert not folder.exists()  # the converted folder is the platform's own copy


@needs_sandbox
def test_a_gguf_on_the_server_is_copied_in_and_converted(researcher_client, researcher, tiny):
    grant_server_paths(researcher)
    response = researcher_client.post("/api/models/import-gguf/", {"path": str(tiny["qwen2"])}, format="json")
    assert response.status_code == 202, response.content
    record = ModelImport.objects.get(pk=response.json()["id"])
    assert record.state == "done", record.error
    assert record.name == "tiny-qwen2" and record.source_path == str(tiny["qwen2"])  # named after the file
    assert record.sha256 == hashlib.sha256(tiny["qwen2"].read_bytes()).hexdigest()
    assert record.model.architecture == "Qwen2ForCausalLM" and record.model.provenance["tokenizer"] == "gpt2"
    assert staging_left() == []


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"PK\x03\x04zipped", "not a GGUF file: it starts with 50 4b 03 04, not the magic bytes"),
        (b"GGUF\x01\x00\x00\x00" + b"\x00" * 16, "GGUF version 1: transformers reads versions 2 and 3"),
    ],
)
def test_a_file_that_is_not_a_gguf_is_refused_at_once_and_nothing_stays(researcher_client, tmp_path, content, says):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(content)
    response = upload(researcher_client, bad)
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["loc"] == "file" and says in error["msg"]
    assert not ModelImport.objects.exists() and staging_left() == []


def test_an_upload_over_the_limit_is_refused_and_not_kept(researcher_client, tiny, settings):
    settings.GGUF_IMPORT_MAX_BYTES = 1000
    response = upload(researcher_client, tiny["llama"])
    assert response.status_code == 400 and response.json()["errors"][0]["loc"] == "file"
    assert "over the limit of 0.00 GiB (GGUF_IMPORT_MAX_BYTES)" in response.json()["errors"][0]["msg"]
    assert staging_left() == []


def test_the_name_must_be_free_among_models_and_imports_under_way(researcher_client, tiny):
    ModelAsset.objects.create(name="taken", path="/nonexistent", project=default_project())
    response = upload(researcher_client, tiny["llama"], name="taken")
    assert response.status_code == 400 and response.json()["errors"][0]["loc"] == "name"
    ModelImport.objects.create(name="coming", source_name="x.gguf", project=default_project(), state="running")
    response = upload(researcher_client, tiny["llama"], name="coming")
    assert "is being imported" in response.json()["errors"][0]["msg"]
    assert staging_left() == []


def test_a_server_path_needs_the_permission_and_a_file_inside_the_roots(researcher_client, researcher, tiny):
    response = researcher_client.post("/api/models/import-gguf/", {"path": str(tiny["llama"])}, format="json")
    assert response.status_code == 403 and response.json()["errors"][0]["loc"] == "path"
    grant_server_paths(researcher)
    response = researcher_client.post("/api/models/import-gguf/", {"path": "/etc/passwd"}, format="json")
    assert response.status_code == 400 and "outside the server folders" in response.json()["errors"][0]["msg"]
    both = researcher_client.post("/api/models/import-gguf/", {"path": "/x.gguf", "file": "x"}, format="multipart")
    assert both.status_code == 400
    empty = researcher_client.post("/api/models/import-gguf/", {}, format="json")
    assert empty.status_code == 400 and empty.json()["errors"][0]["loc"] == "file"
    assert not ModelImport.objects.exists()


def failed_import(client, path: Path) -> ModelImport:
    response = upload(client, path)
    assert response.status_code == 202, response.content
    record = ModelImport.objects.get(pk=response.json()["id"])
    assert record.state == "failed" and record.model is None and record.finished_at is not None
    assert staging_left() == [] and not ModelAsset.objects.exists()
    return record


def test_a_truncated_gguf_fails_its_import_naming_the_tensor_cut_off(researcher_client, tiny, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny["llama"].read_bytes()[:-10])
    record = failed_import(researcher_client, cut)
    assert record.error.startswith("truncated: the data of tensor 'output_norm.weight' (F32, 128 bytes from byte")


def test_a_tensor_type_transformers_cannot_dequantize_fails_the_import_naming_it(researcher_client, tmp_path):
    odd = write_tiny_gguf(tmp_path / "odd.gguf", odd_tensor=("blk.0.ffn_down.weight", "I8"))
    record = failed_import(researcher_client, odd)
    assert record.error.startswith("tensor 'blk.0.ffn_down.weight' is stored as I8, a type transformers cannot")


@needs_sandbox
def test_an_architecture_transformers_cannot_dequantize_fails_the_import_listing_those_it_can(
    researcher_client, tmp_path
):
    other = write_tiny_gguf(tmp_path / "other.gguf", arch="rwkv7")
    record = failed_import(researcher_client, other)
    assert record.error.startswith("architecture 'rwkv7' (general.architecture) is not one transformers can")
    assert "llama" in record.error and "qwen2" in record.error


def test_imports_no_worker_finished_or_took_are_failed_and_their_leftovers_removed(settings, storage):
    project = default_project()
    now = timezone.now()
    running = ModelImport.objects.create(name="a", source_name="a.gguf", project=project, state="running")
    ModelImport.objects.filter(pk=running.pk).update(started_at=now - timedelta(seconds=imports._task_limit_s() + 61))
    queued = ModelImport.objects.create(name="b", source_name="b.gguf", project=project)
    ModelImport.objects.filter(pk=queued.pk).update(
        created_at=now - timedelta(seconds=settings.GGUF_IMPORT_QUEUE_S + 1)
    )
    fresh = ModelImport.objects.create(name="c", source_name="c.gguf", project=project)
    for record in (running, fresh):
        uploads.staging_folder(record.pk).mkdir(parents=True)
    old = now.timestamp() - imports.LEFTOVER_AFTER_S - 1
    os.utime(uploads.staging_folder(running.pk), (old, old))
    assert imports.model_imports_expire(now) == 2
    assert ModelImport.objects.get(pk=running.pk).state == "failed"
    assert "no worker took it" in ModelImport.objects.get(pk=queued.pk).error
    assert staging_left() == [str(fresh.pk)]  # a live import's folder stays


def test_another_projects_import_is_not_found(client_for):
    from posttrain.projects.models import Project

    elsewhere = Project.objects.create(name="elsewhere")
    record = ModelImport.objects.create(name="x", source_name="x.gguf", project=elsewhere)
    response = client_for("researcher").get(f"/api/models/imports/{record.pk}/")
    assert response.status_code == 404


def test_the_import_runs_on_the_user_code_queue_under_the_conversions_deadline_and_expires_with_the_trials(settings):
    from workers.tasks import model_import_run, worker_jobs_expire

    assert settings.CELERY_TASK_ROUTES["workers.model_import_run"] == {"queue": settings.USER_CODE_QUEUE}
    assert model_import_run.soft_time_limit == settings.GGUF_IMPORT_TIMEOUT_S + settings.GGUF_IMPORT_COPY_S
    assert model_import_run.time_limit == model_import_run.soft_time_limit + 30
    stuck = ModelImport.objects.create(name="x", source_name="x.gguf", project=default_project(), state="running")
    ModelImport.objects.filter(pk=stuck.pk).update(started_at=timezone.now() - timedelta(days=1))
    assert worker_jobs_expire() == 1
    assert ModelImport.objects.get(pk=stuck.pk).state == "failed"
