"""A run's checkpoint registers as a model with its lineage (the run page's "register as model")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from posttrain.registry.models import ModelAsset
from posttrain.runs.models import Checkpoint, RunState
from tests.unit.platform.helpers import make_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]


def test_a_checkpoint_registers_as_a_model_that_remembers_its_run_and_step(api, experiment, tiny_model, storage):
    run = make_run(experiment, RunState.SUCCEEDED)
    folder = storage / "runs" / str(run.pk) / "checkpoints" / "step_4"
    shutil.copytree(tiny_model, folder)
    checkpoint = Checkpoint.objects.create(run=run, step=4, path=str(folder))

    response = api.post(
        f"/api/runs/{run.pk}/register-checkpoint/",
        {"checkpoint": checkpoint.pk, "name": "sums-step-4"},
        content_type="application/json",
    )

    assert response.status_code == 201, response.content
    model = ModelAsset.objects.get(pk=response.json()["id"])
    assert (model.name, model.source, model.source_run_id, model.source_step) == (
        "sums-step-4",
        "checkpoint",
        run.pk,
        4,
    )
    assert model.architecture == "Qwen2ForCausalLM" and model.parameter_count > 0


def test_a_checkpoint_outside_its_runs_folder_is_refused_and_not_read(api, experiment, tiny_model):
    # The path comes from the engine's checkpoint event: only the run's own folder is trusted with it.
    run = make_run(experiment, RunState.SUCCEEDED)
    checkpoint = Checkpoint.objects.create(run=run, step=1, path=str(tiny_model))
    response = api.post(
        f"/api/runs/{run.pk}/register-checkpoint/", {"checkpoint": checkpoint.pk}, content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json()["errors"] == [
        {"loc": "checkpoint", "msg": f"{tiny_model} is not a checkpoint folder of run {run.pk}"}
    ]
    assert not ModelAsset.objects.filter(source=ModelAsset.Source.CHECKPOINT).exists()


def test_a_checkpoint_of_another_run_is_refused_naming_the_field(api, experiment, tiny_model):
    run, other = make_run(experiment, RunState.SUCCEEDED), make_run(experiment, RunState.SUCCEEDED)
    checkpoint = Checkpoint.objects.create(run=other, step=1, path=str(tiny_model))
    response = api.post(
        f"/api/runs/{run.pk}/register-checkpoint/", {"checkpoint": checkpoint.pk}, content_type="application/json"
    )
    assert response.status_code == 400
    assert "checkpoint" in response.content.decode()


def test_a_lora_checkpoint_registers_its_merged_weights_and_keeps_its_adapter(api, experiment, tiny_model, storage):
    # The engine writes a LoRA run's checkpoint as a plain model folder (merged weights) plus `adapter/`.
    import torch
    from safetensors.torch import save_file

    run = make_run(experiment, RunState.SUCCEEDED)
    shutil.copytree(tiny_model, storage / "runs" / str(run.pk) / "checkpoints" / "step_1")
    folder = storage / "runs" / str(run.pk) / "checkpoints" / "step_2"
    shutil.copytree(tiny_model, folder)
    (folder / "adapter").mkdir()
    (folder / "adapter" / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4}')
    save_file(
        {"base_model.model.lm_head.lora_A.weight": torch.zeros(4, 32)}, folder / "adapter" / "adapter_model.safetensors"
    )
    plain = Checkpoint.objects.create(run=run, step=1, path=str(folder.parent / "step_1"))
    lora = Checkpoint.objects.create(run=run, step=2, path=str(folder))

    counts = []
    for checkpoint, name in ((plain, "plain"), (lora, "lora")):
        response = api.post(
            f"/api/runs/{run.pk}/register-checkpoint/",
            {"checkpoint": checkpoint.pk, "name": name},
            content_type="application/json",
        )
        assert response.status_code == 201, response.content
        counts.append(ModelAsset.objects.get(pk=response.json()["id"]).parameter_count)
    assert counts[0] == counts[1] > 0  # the adapter's tensors are not the model's parameters
    registered = ModelAsset.objects.get(name="lora")
    assert (Path(registered.path) / "adapter" / "adapter_model.safetensors").is_file()
