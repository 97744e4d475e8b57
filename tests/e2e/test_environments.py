"""Installed environments in the browser: the registry page lists them with their package, id and state, and
the launch form offers them, filling in the dataset and the environment's own reward (single-turn) or its
environment section (multi-turn) so that the experiment validates and launches.

The web_server fixture has no Celery worker: the environments are generated here, in the test process (in the
sandbox, as a worker does), and a launched run stays queued."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.support.browser import PASSWORD, log_in, open_ready, screenshot
from tests.unit.platform.helpers import default_project, grant_server_paths, join

pytestmark = pytest.mark.django_db(transaction=True)
pytest.importorskip("reasoning_gym")
pytest.importorskip("textarena")


@pytest.fixture(scope="module")
def tiny_model_folder(tmp_path_factory) -> Path:
    from rl_engine.demo.build import build_demo

    out = tmp_path_factory.mktemp("environments-demo")
    build_demo(out, seed=0, model_size="tiny", sft_steps=0, progress=False)
    return out / "model"


@pytest.fixture
def setup(tiny_model_folder, monkeypatch, settings, tmp_path, web_storage):
    from posttrain.accounts.services import user_create
    from posttrain.registry import services

    settings.STORAGE_ROOT = web_storage  # the generated datasets go where the web server opens them
    environments = importlib.import_module("posttrain.registry.services.environments")
    monkeypatch.setattr(environments, "_dispatch_generate", lambda env: environments.environment_generate(env.pk))
    user = grant_server_paths(
        join(user_create("grace", PASSWORD, "researcher"), "maintainer")
    )  # an admin's grant: the model's folder
    model = services.model_register("tiny-qwen", str(tiny_model_folder), user=user, project=default_project())
    arith = services.environment_create(
        "arith", "reasoning_gym", "basic_arithmetic", size=16, user=user, project=default_project()
    )
    guess = services.environment_create(
        "guess", "textarena", "GuessTheNumber-v0", size=8, user=user, project=default_project()
    )
    arith.refresh_from_db()
    guess.refresh_from_db()
    assert arith.state == guess.state == "ready", (arith.error, guess.error)
    return model, arith, guess


def test_the_registry_lists_environments_and_the_launch_form_fills_in_a_multi_turn_one(web_server, page, setup):
    from posttrain.runs.models import Run

    model, arith, guess = setup
    log_in(page, web_server, "grace")
    open_ready(page, f"{web_server}/registry/")
    row = page.locator('#environment-rows tr[data-environment="guess"]')
    expect(row).to_contain_text("textarena")
    expect(row).to_contain_text("GuessTheNumber-v0")
    expect(row).to_contain_text("ready")
    expect(row.locator("button.environment-try")).to_be_visible()
    screenshot(page, "registry-environments")

    open_ready(page, f"{web_server}/launch/")
    page.fill("#exp-name", "guess grpo")
    page.select_option("#exp-model", str(model.pk))
    page.select_option("#exp-environment", str(guess.pk))
    expect(page.locator("#exp-dataset")).to_have_value(str(guess.dataset_id))
    expect(page.locator("#environment-facts")).to_contain_text("played turn by turn")
    expect(page.locator("#yaml-text")).to_have_value(re.compile(r"package: textarena"))
    expect(page.locator("#validation-status")).to_contain_text("Valid")
    screenshot(page, "launch-environment")
    page.click("#launch-button")
    page.wait_for_url(re.compile(r".*/runs/[0-9a-f-]{36}/$"))
    run = Run.objects.get(pk=page.url.rstrip("/").rsplit("/", 1)[-1])
    assert run.resolved_config["environment"]["package"] == "textarena"
    assert run.resolved_config["environment"]["options"] == {"env_id": "GuessTheNumber-v0"}
    assert run.resolved_config["rewards"] == []
    assert run.resolved_config["data"]["path"] == guess.dataset.path


def test_a_single_turn_environment_brings_its_own_reward_into_the_launch_form(web_server, page, setup):
    model, arith, _ = setup
    log_in(page, web_server, "grace")
    open_ready(page, f"{web_server}/launch/")
    page.fill("#exp-name", "arith grpo")
    page.select_option("#exp-model", str(model.pk))
    page.select_option("#exp-environment", str(arith.pk))
    expect(page.locator("#reward-rows tr")).to_have_count(1)
    expect(page.locator("#reward-rows tr")).to_contain_text("arith")
    expect(page.locator("#exp-dataset")).to_have_value(str(arith.dataset_id))
    expect(page.locator("#validation-status")).to_contain_text("Valid")


def test_a_verifiers_tool_environment_is_offered_as_episodes(web_server, page, setup, tmp_path):
    import shutil

    from django.contrib.auth.models import User

    from posttrain.registry import services

    pytest.importorskip("verifiers.v1")
    model, _, _ = setup
    fixture = tmp_path / "vf_multiply_tools.py"  # a server file inside the tests' import root
    shutil.copy(Path(__file__).resolve().parents[1] / "fixtures" / "verifiers_envs" / fixture.name, fixture)
    grace = User.objects.get(username="grace")
    tools = services.environment_create(
        "products", "verifiers", "vf_multiply_tools", files=[str(fixture)], user=grace, project=default_project()
    )
    tools.refresh_from_db()
    assert tools.state == "ready", tools.error
    log_in(page, web_server, "grace")
    open_ready(page, f"{web_server}/launch/")
    page.fill("#exp-name", "products grpo")
    page.select_option("#exp-model", str(model.pk))
    page.select_option("#exp-environment", str(tools.pk))
    expect(page.locator("#environment-facts")).to_contain_text("played turn by turn")
    expect(page.locator("#yaml-text")).to_have_value(re.compile(r"package: verifiers"))
    expect(page.locator("#yaml-text")).to_have_value(re.compile(r"taskset: vf_multiply_tools"))
    expect(page.locator("#validation-status")).to_contain_text("Valid")
