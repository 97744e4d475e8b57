"""`manage.py demo_launch DIR [--set KEY=VALUE ...]`: the demo experiment, or a variant of it with overrides."""

from __future__ import annotations

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
