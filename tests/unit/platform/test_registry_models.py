"""Models registry: local Hugging Face folders and run checkpoints (with lineage)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from posttrain.registry.model_files import inspect_model_folder
from posttrain.registry.models import ModelAsset
from posttrain.registry.services import model_register, model_register_checkpoint
from posttrain.runs.services.launch import run_dir_for
from tests.unit.platform.helpers import (
    an_experiment,
    default_project,
    grant_server_paths,
    write_model_folder,
    write_safetensors,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _researcher_may_name_server_paths(researcher):
    """These tests register files on the server, which an admin grants (tests/security tries it without)."""
    grant_server_paths(researcher)


def test_registering_a_model_folder_reads_architecture_and_parameter_count(researcher_client, tiny_model):
    response = researcher_client.post("/api/models/", {"name": "tiny", "path": str(tiny_model)}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["architecture"] == "Qwen2ForCausalLM"
    assert body["hf_config"]["model_type"] == "qwen2"
    assert body["source"] == "folder"
    assert body["created_by"] == "ada"  # the `researcher` fixture

    from transformers import AutoModelForCausalLM

    # Tied input/output embeddings are stored once and counted once by torch as well.
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert body["parameter_count"] == sum(p.numel() for p in model.parameters())


def test_parameter_count_sums_every_shard_of_an_indexed_checkpoint_and_skips_metadata(tmp_path):
    folder = write_model_folder(tmp_path / "m", {"unused": [1]})
    (folder / "model.safetensors").unlink()
    write_safetensors(
        folder / "model-00001-of-00002.safetensors", {"a": [4, 5], "scalar": []}, metadata={"format": "pt"}
    )
    write_safetensors(folder / "model-00002-of-00002.safetensors", {"b": [3, 2, 2]})
    index = {
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "scalar": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        }
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))

    info = inspect_model_folder(folder)

    assert info.parameter_count == 20 + 1 + 12
    assert info.weight_files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_a_shard_missing_from_the_index_is_counted_not_quoted(tmp_path):
    folder = write_model_folder(tmp_path / "m")
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00002-of-00002.safetensors"}})
    )
    with pytest.raises(ValidationError) as exc:
        model_register("m", str(folder), project=default_project())
    message = exc.value.message_dict["path"][0]
    # The index is a file on the server, not the user's upload: its content (the shard's name) is not echoed.
    assert "1 of the 1 shards model.safetensors.index.json lists are missing" in message
    assert "model-00002" not in message


def test_a_folder_with_only_pytorch_bin_weights_registers_without_a_parameter_count(tmp_path):
    folder = write_model_folder(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"pickled")
    model = model_register("bin-model", str(folder), project=default_project())
    assert model.parameter_count is None
    assert model.architecture == "LlamaForCausalLM"


def test_a_folder_without_config_json_is_refused_naming_the_path(researcher_client, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    response = researcher_client.post("/api/models/", {"name": "x", "path": str(folder)}, format="json")
    assert response.status_code == 400
    assert response.json() == {"errors": [{"loc": "path", "msg": f"no config.json in {folder}"}]}


def test_a_second_model_with_the_same_name_is_refused(researcher_client, tmp_path):
    folder = write_model_folder(tmp_path / "m")
    assert (
        researcher_client.post("/api/models/", {"name": "same", "path": str(folder)}, format="json").status_code == 201
    )
    response = researcher_client.post("/api/models/", {"name": "same", "path": str(folder)}, format="json")
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["loc"] == "name" and "already exists" in error["msg"]


def test_models_filter_by_name_and_architecture(researcher_client, tmp_path):
    model_register("llama-small", str(write_model_folder(tmp_path / "a")), project=default_project())
    model_register(
        "qwen-small",
        str(write_model_folder(tmp_path / "b", architecture="Qwen2ForCausalLM")),
        project=default_project(),
    )
    names = lambda q: [m["name"] for m in researcher_client.get("/api/models/", q).json()["results"]]  # noqa: E731
    assert names({"name": "QWEN"}) == ["qwen-small"]
    assert names({"architecture": "llamaforcausallm"}) == ["llama-small"]
    assert sorted(names({})) == ["llama-small", "qwen-small"]


def test_a_model_can_be_renamed_and_described_but_not_moved(researcher_client, tmp_path):
    model = model_register("old", str(write_model_folder(tmp_path / "m")), project=default_project())
    response = researcher_client.patch(
        f"/api/models/{model.pk}/", {"name": "new", "description": "d", "path": "/x"}, format="json"
    )
    assert response.status_code == 200
    model.refresh_from_db()
    assert (model.name, model.description, model.path) == ("new", "d", str((tmp_path / "m").resolve()))


def test_deleting_a_model_an_experiment_uses_is_refused_with_409(researcher_client):
    experiment = an_experiment(name="uses-it")
    response = researcher_client.delete(f"/api/models/{experiment.model.pk}/")
    assert response.status_code == 409
    assert "uses-it" in response.json()["errors"][0]["msg"]
    assert ModelAsset.objects.filter(pk=experiment.model.pk).exists()


def test_deleting_an_unused_model_keeps_the_users_folder(researcher_client, tmp_path):
    folder = write_model_folder(tmp_path / "m")
    model = model_register("m", str(folder), project=default_project())
    assert researcher_client.delete(f"/api/models/{model.pk}/").status_code == 204
    assert (folder / "config.json").exists()


def _checkpoint(run_dir: Path, source: Path, step: int) -> Path:
    checkpoint = run_dir / "checkpoints" / f"step_{step}"
    shutil.copytree(source, checkpoint)
    (checkpoint / "engine_state.pt").write_bytes(b"optimizer state")
    return checkpoint


def test_a_registered_checkpoint_keeps_its_lineage_and_outlives_checkpoint_rotation(tmp_path, tiny_model):
    from posttrain.runs.models import Run

    experiment = an_experiment()
    run = Run.objects.create(experiment=experiment, name="grpo-1")
    checkpoint = _checkpoint(run_dir_for(run.pk), tiny_model, step=3)

    model = model_register_checkpoint(run, 3, str(checkpoint), project=default_project())

    assert (model.name, model.source, model.source_run, model.source_step) == ("grpo-1-step-3", "checkpoint", run, 3)
    assert model.architecture == "Qwen2ForCausalLM"
    assert model.parameter_count == inspect_model_folder(tiny_model).parameter_count
    shutil.rmtree(checkpoint)  # the engine keeps only the last N checkpoints
    stored = Path(model.path)
    assert (stored / "model.safetensors").exists() and (stored / "tokenizer.json").exists()
    assert not (stored / "engine_state.pt").exists()


def test_deleting_a_checkpoint_model_removes_its_stored_copy(tmp_path, tiny_model, django_capture_on_commit_callbacks):
    from posttrain.registry.services import model_delete
    from posttrain.runs.models import Run

    run = Run.objects.create(experiment=an_experiment())
    model = model_register_checkpoint(
        run, 1, str(_checkpoint(run_dir_for(run.pk), tiny_model, step=1)), name="ckpt", project=default_project()
    )
    with django_capture_on_commit_callbacks(execute=True):
        model_delete(model)
    assert not Path(model.path).exists()


def test_a_config_with_nan_and_nul_characters_is_stored_as_json_the_database_accepts(tmp_path):
    folder = write_model_folder(tmp_path / "m")
    (folder / "config.json").write_text('{"architectures": ["X"], "eps": NaN, "note": "a\\u0000b"}')
    model = model_register("odd-config", str(folder), project=default_project())
    model.refresh_from_db()
    assert model.hf_config == {"architectures": ["X"], "eps": "NaN", "note": "a\ufffdb"}
