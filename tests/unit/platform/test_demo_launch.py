"""`manage.py demo_launch DIR [--set KEY=VALUE ...]`: the demo experiment, or a variant of it with overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from posttrain.runs.models import Experiment, Run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]

DEMO = "demo-addition-grpo"


@pytest.fixture
def assets(tiny_model: Path) -> Path:
    """A demo build (manifest, model, data); the tiny size is enough, nothing trains here."""
    get_user_model().objects.create_superuser(username="admin", email="", password="a-long-test-passphrase")
    return tiny_model.parent


def test_set_launches_a_variant_experiment_with_the_overrides_and_leaves_the_demo_experiment_alone(assets):
    call_command("demo_launch", str(assets))
    plain = Experiment.objects.get(name=DEMO)
    plain_config = dict(plain.config)

    call_command("demo_launch", str(assets), "--set", "backends.rollout=vllm", "--set", "train.steps=40")

    variant = Experiment.objects.get(name=f"{DEMO}+backends.rollout=vllm+train.steps=40")
    assert variant.config["backends"] == {**plain.config.get("backends", {}), "rollout": "vllm"}
    assert variant.config["train"]["steps"] == 40  # a YAML scalar, as `python -m rl_engine train --set` reads it
    run = Run.objects.get(experiment=variant)
    assert run.resolved_config["backends"]["rollout"] == "vllm"
    assert run.resolved_config["name"] == f"{DEMO}-backends.rollout-vllm-train.steps-40"  # the experiment's name
    plain.refresh_from_db()
    assert plain.config == plain_config and plain.runs.count() == 1

    # Idempotent, as the plain demo is: the variant's run in flight is reported, not launched again.
    call_command("demo_launch", str(assets), "--set", "backends.rollout=vllm", "--set", "train.steps=40")
    assert Run.objects.filter(experiment=variant).count() == 1


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("backends.rollout", "expected key.path=value"),
        ("model.path=/elsewhere", "model.path"),
        ("backends.rollout=sglang", "backends.rollout"),
    ],
)
def test_a_bad_override_is_a_command_error_and_creates_nothing(assets, override, message):
    with pytest.raises(CommandError, match=message.replace(".", r"\.")):
        call_command("demo_launch", str(assets), "--set", override)
    assert not Experiment.objects.exists() and not Run.objects.exists()


def test_the_demo_experiment_holds_two_cpus_unless_the_overrides_place_it(assets, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    call_command("demo_launch", str(assets))
    run = Run.objects.get(experiment__name=DEMO)
    assert run.resources["driver"] == {"CPU": 2.0, "GPU": 0.0}, "two threads, and a neighbour waits its turn"

    call_command("demo_launch", str(assets), "--set", "placement.cpus_per_trainer=1")
    placed = Run.objects.get(experiment__name=f"{DEMO}+placement.cpus_per_trainer=1")
    assert placed.resources["driver"]["CPU"] == 1.0


def test_set_on_a_field_of_an_absent_optional_section_launches_it_with_its_defaults(assets):
    call_command("demo_launch", str(assets), "--set", "agent.port=18123")

    run = Run.objects.get(experiment__name=f"{DEMO}+agent.port=18123")
    assert run.resolved_config["agent"]["port"] == 18123
    assert run.resolved_config["agent"]["host"] == "127.0.0.1"  # the section's defaults for the rest


# --- the real model beside the toy (--smollm2 DIR) ----------------------------------------------------------


@pytest.fixture
def smollm2_task(tmp_path: Path) -> Path:
    """A prepared SmolLM2 folder as `python -m rl_engine demo smollm2` writes it, with a tiny GGUF standing in for
    the real one (tests/integration/test_run_lifecycle.py imports and trains the real one)."""
    from tests.support.gguf_files import write_tiny_gguf

    folder = tmp_path / "smollm2"
    folder.mkdir()
    write_tiny_gguf(folder / "tiny.gguf", "llama")
    row = {"prompt": "Calculate 2 + 3.", "label": "5", "data_source": "reasoning_gym/basic_arithmetic"}
    for name in ("train.jsonl", "test.jsonl"):
        (folder / name).write_text(json.dumps(row) + "\n")
    (folder / "manifest.json").write_text(json.dumps({"gguf": "tiny.gguf"}))
    return folder


def test_smollm2_is_registered_beside_the_demo_with_its_experiment_one_click_away_not_launched(assets, smollm2_task):
    from posttrain.projects.models import Project, default_project_id
    from posttrain.registry.models import ModelAsset, RewardFunction

    project = Project.objects.get(pk=default_project_id())
    model = ModelAsset.objects.create(name="smollm2-135m-instruct", path=str(assets / "model"), project=project)
    call_command("demo_launch", str(assets), "--smollm2", str(smollm2_task))

    experiment = Experiment.objects.get(name="smollm2-arithmetic-grpo")
    assert experiment.model == model and experiment.dataset.name == "smollm2-arithmetic"
    assert "s a step on two CPU cores" in experiment.description
    assert experiment.config["data"]["apply_chat_template"] is True
    assert experiment.config["data"]["eval_path"] == str(smollm2_task / "test.jsonl")
    assert experiment.config["model"]["dtype"] == "auto"
    (reward,) = RewardFunction.objects.filter(experimentreward__experiment=experiment)
    assert reward.spec["type"] == "reasoning_gym" and reward.spec["answer"] == "last_number"
    assert not experiment.runs.exists(), "registered, not launched: the toy is what make demo trains"

    call_command("demo_launch", str(assets), "--smollm2", str(smollm2_task))  # make demo again: all reused
    assert Experiment.objects.filter(name="smollm2-arithmetic-grpo").count() == 1
    assert ModelAsset.objects.filter(name="smollm2-135m-instruct").count() == 1


def test_an_import_that_does_not_finish_in_time_is_reported_and_no_smollm2_experiment_is_made(
    assets, smollm2_task, monkeypatch, capsys
):
    from posttrain.registry.models import ModelImport

    monkeypatch.setattr("posttrain.runs.management.commands.demo_launch.IMPORT_WAIT_S", 0.0)
    call_command("demo_launch", str(assets), "--smollm2", str(smollm2_task))  # no worker here: it stays queued

    assert "SmolLM2-135M-Instruct was not imported: still queued after 0 s" in capsys.readouterr().err
    assert not Experiment.objects.filter(name__startswith="smollm2").exists()
    call_command("demo_launch", str(assets), "--smollm2", str(smollm2_task))
    assert ModelImport.objects.count() == 1, "the import under way is waited for, not repeated"


def test_smollm2_without_its_prepared_folder_is_a_command_error(assets, tmp_path):
    with pytest.raises(CommandError, match="no SmolLM2 task here; run `python -m rl_engine demo smollm2"):
        call_command("demo_launch", str(assets), "--smollm2", str(tmp_path))
