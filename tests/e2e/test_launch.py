"""Launch from the browser: upload a dataset on the registry page, fill the config form generated
from the engine's schema, see the engine's errors next to the field, launch, and pre-fill the form
again from the run (clone) and from the experiment (YAML applied into the form).

The web_server fixture has no Celery worker: a launched run stays queued, which is all these tests
need (the engine path is tested elsewhere)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from tests.support.browser import PASSWORD, log_in, open_ready, screenshot
from tests.unit.platform.helpers import default_project, join

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def tiny_model_folder(tmp_path_factory) -> Path:
    """A real tiny Hugging Face model folder (registered, never run here)."""
    from rl_engine.demo.build import build_demo

    out = tmp_path_factory.mktemp("launch-demo")
    build_demo(out, seed=0, model_size="tiny", sft_steps=0, progress=False)
    return out / "model"


@pytest.fixture
def researcher():
    from posttrain.accounts.services import user_create

    return join(user_create("rosalind", PASSWORD, "researcher"), "maintainer")


@pytest.fixture
def model_and_reward(researcher, tiny_model_folder):
    from posttrain.registry import services
    from tests.unit.platform.helpers import grant_server_paths

    grant_server_paths(researcher)  # registering a folder on the server is an admin's grant
    model = services.model_register("tiny-qwen", str(tiny_model_folder), user=researcher, project=default_project())
    reward = services.reward_create(
        "exact answer", "builtin", {"type": "exact_match"}, user=researcher, project=default_project()
    )
    return model, reward


def config_field(page, loc: str):
    return page.locator(f'.sf-field[data-loc="{loc}"]')


def upload_dataset(page, web_server: str, tmp_path: Path) -> None:
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(12)))
    open_ready(page, f"{web_server}/registry/")
    # Without a file the API's own error shows next to the file input.
    page.click("#dataset-form button[type=submit]")
    expect(page.locator('#dataset-form [data-field="file"] .field-error')).to_contain_text("No file was submitted")

    page.set_input_files("#dataset-file", str(data))
    page.fill("#dataset-name", "sums")
    page.fill("#dataset-prompt-field", "question")
    page.fill("#dataset-label-field", "answer")
    page.click("#dataset-form button[type=submit]")
    row = page.locator("#dataset-rows tr", has_text="sums")
    expect(row).to_contain_text("question → answer")
    expect(row).to_contain_text("12")
    expect(page.locator("#dataset-form .form-status")).to_contain_text("Uploaded “sums”: 12 rows")
    row.click()
    expect(page.locator("#dataset-preview table")).to_contain_text("3+1=")
    screenshot(page, "registry-after-upload")


def test_a_researcher_uploads_a_dataset_launches_from_the_form_and_clones_the_run(
    web_server, page, model_and_reward, tmp_path
):
    from posttrain.registry.models import Dataset
    from posttrain.runs.models import Experiment, Run

    model, reward = model_and_reward
    log_in(page, web_server, "rosalind")
    upload_dataset(page, web_server, tmp_path)
    dataset = Dataset.objects.get(name="sums")

    open_ready(page, f"{web_server}/launch/")
    page.fill("#exp-name", "sums grpo")
    expect(page.locator("#validation-status")).to_contain_text("Still to choose: model, dataset, rewards")
    page.select_option("#exp-model", str(model.pk))
    page.select_option("#exp-dataset", str(dataset.pk))
    page.select_option("#reward-add", str(reward.pk))
    expect(page.locator("#reward-rows tr")).to_contain_text("exact answer")

    samples = config_field(page, "rollout.samples_per_prompt")
    expect(samples.locator("input")).to_have_value("8")  # the schema's default
    expect(samples).to_contain_text("Responses generated per prompt")  # its description as help
    samples.locator("input").fill("1")
    expect(samples.locator(".field-error")).to_contain_text(
        "group estimator 'grpo' needs more than one sample per prompt"
    )
    expect(page.locator("#validation-status")).to_contain_text("1 problem to fix")
    screenshot(page, "launch-inline-error")

    samples.locator("input").fill("4")
    config_field(page, "seed").locator("input").fill("7")
    page.fill("#run-tags", "e2e, first")
    expect(page.locator("#validation-status")).to_contain_text("Valid")
    expect(samples.locator(".field-error")).to_be_hidden()
    expect(page.locator("#yaml-text")).to_have_value(re.compile(r"^seed: 7\nrollout:\n  samples_per_prompt: 4\n$"))
    screenshot(page, "launch-valid")

    page.click("#launch-button")
    page.wait_for_url(re.compile(r".*/runs/[0-9a-f-]{36}/$"))
    run = Run.objects.get(pk=page.url.rstrip("/").rsplit("/", 1)[-1])
    assert (run.state, run.seed, run.tags) == ("queued", 7, ["e2e", "first"])
    assert run.experiment.config == {"seed": 7, "rollout": {"samples_per_prompt": 4}}
    resolved = run.resolved_config
    assert resolved["rollout"]["samples_per_prompt"] == 4
    assert resolved["model"]["path"] == model.path
    assert (resolved["data"]["path"], resolved["data"]["prompt_field"]) == (dataset.path, "question")
    assert [(r["type"], r["weight"]) for r in resolved["rewards"]] == [("exact_match", 1.0)]

    # Clone: the form comes back with the same values; launched unchanged, it is a new run of the experiment.
    open_ready(page, f"{web_server}/launch/?from_run={run.id}")
    expect(page.locator("#exp-name")).to_have_value("sums grpo")
    expect(page.locator("#exp-model")).to_have_value(str(model.pk))
    expect(page.locator("#exp-dataset")).to_have_value(str(dataset.pk))
    expect(page.locator("#reward-rows tr")).to_have_count(1)
    expect(page.locator("#reward-rows tr")).to_contain_text("exact answer")
    expect(page.locator("#reward-rows input.weight")).to_have_value("1")
    expect(samples.locator("input")).to_have_value("4")
    expect(config_field(page, "seed").locator("input")).to_have_value("7")
    expect(page.locator("#run-tags")).to_have_value("e2e, first")
    expect(page.locator("#validation-status")).to_contain_text("Valid")
    expect(page.locator("#launch-button")).to_contain_text("Launch a new run of “sums grpo”")
    screenshot(page, "launch-cloned")

    page.click("#launch-button")
    page.wait_for_url(re.compile(r".*/runs/[0-9a-f-]{36}/$"))
    clone = Run.objects.get(pk=page.url.rstrip("/").rsplit("/", 1)[-1])
    assert clone.pk != run.pk and clone.experiment_id == run.experiment_id
    assert Experiment.objects.count() == 1
    assert clone.resolved_config["rollout"] == resolved["rollout"] and clone.seed == 7


def test_yaml_applied_in_the_pane_refills_the_form_and_a_yaml_error_names_its_line(
    web_server, page, model_and_reward, tmp_path
):
    from posttrain.registry.models import Dataset
    from posttrain.runs import services

    model, reward = model_and_reward
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "1+1=", "label": "2"}\n')
    dataset = Dataset.objects.create(
        name="one",
        sha256="b" * 64,
        format="jsonl",
        path=str(data),
        size_bytes=1,
        row_count=1,
        columns=["prompt", "label"],
    )
    experiment = services.experiment_create(
        name="from yaml",
        model=model,
        dataset=dataset,
        rewards=[(reward, 2.0)],
        config={"train": {"steps": 3}},
        project=default_project(),
    )
    log_in(page, web_server, "rosalind")
    open_ready(page, f"{web_server}/launch/?experiment={experiment.pk}")
    expect(config_field(page, "train.steps").locator("input")).to_have_value("3")
    expect(page.locator("#reward-rows input.weight")).to_have_value("2")
    expect(page.locator("#yaml-text")).to_have_value("train:\n  steps: 3\n")

    page.fill("#yaml-text", "train:\n  steps: 5\n lr: 0.001\n")
    page.click("#yaml-apply")
    expect(page.locator("#yaml-error")).to_contain_text("YAML syntax error at line 3")
    expect(config_field(page, "train.steps").locator("input")).to_have_value("3")  # untouched

    page.fill(
        "#yaml-text", "train:\n  steps: 5\n  lr: 0.001\nrollout:\n  temprature: 0.5\nmodel:\n  path: /elsewhere\n"
    )
    page.click("#yaml-apply")
    expect(page.locator("#yaml-error")).to_be_hidden()
    expect(config_field(page, "train.steps").locator("input")).to_have_value("5")
    expect(config_field(page, "train.lr").locator("input")).to_have_value("0.001")
    expect(page.locator("#yaml-status")).to_contain_text("Ignored model.path")
    # A key the form has no field for is kept, so the engine names it (in its section).
    expect(page.locator('.sf-section[data-loc="rollout"] > .field-error')).to_contain_text(
        "temprature: unknown field 'temprature' (did you mean 'temperature'?)"
    )
    expect(page.locator("#launch-button")).to_contain_text("Create experiment and launch")
    screenshot(page, "launch-yaml-applied")


def test_registry_forms_put_the_apis_errors_next_to_their_fields_and_list_what_they_create(
    web_server, page, researcher, tiny_model_folder
):
    from tests.unit.platform.helpers import grant_server_paths

    grant_server_paths(researcher)  # registering a folder on the server is an admin's grant
    log_in(page, web_server, "rosalind")
    open_ready(page, f"{web_server}/registry/")

    page.fill("#model-name", "tiny")
    page.fill("#model-path", "/nonexistent/model")
    page.click("#model-form button[type=submit]")
    expect(page.locator('#model-form [data-field="path"] .field-error')).to_contain_text(
        "/nonexistent/model is outside the server folders an admin opened for imports"
    )
    page.fill("#model-path", str(tiny_model_folder))
    page.click("#model-form button[type=submit]")
    expect(page.locator("#model-rows tr", has_text="tiny")).to_contain_text("Qwen2ForCausalLM")

    # The spec fields come from the engine's schema for the chosen verifier.
    page.fill("#reward-name", "has a number")
    page.select_option("#reward-type", "regex")
    pattern = page.locator('#reward-spec .sf-field[data-loc="spec.pattern"]')
    expect(pattern).to_contain_text("Regular expression in RE2 syntax")
    pattern.locator("input").fill("[0-")
    page.click("#reward-form button[type=submit]")
    expect(pattern.locator(".field-error")).to_contain_text("invalid regular expression")
    pattern.locator("input").fill(r"\d+")
    page.click("#reward-form button[type=submit]")
    expect(page.locator("#reward-rows tr", has_text="has a number")).to_contain_text("regex \\d+")
    screenshot(page, "registry-forms")


def test_the_form_error_helper_puts_each_error_at_the_closest_field_it_names(web_server, page, researcher):
    """form_errors.js, every form's one renderer, checked in the browser that runs it."""
    log_in(page, web_server, "rosalind", "/launch/")
    result = page.evaluate("""async () => {
        const m = await import('/static/js/form_errors.js');
        const root = document.createElement('div');
        root.innerHTML = '<div data-loc="questions[1]"><div class="field-error" hidden></div></div>'
            + '<div data-loc="name"><div class="field-error" hidden></div></div>';
        const target = (loc) => {
            const owner = root.querySelector(`[data-loc="${loc}"]`);
            return owner ? { node: owner.querySelector('.field-error'), owner } : null;
        };
        const rest = m.placeFieldErrors([
            { loc: 'name', msg: 'is required' },
            { loc: 'questions[1].labels[2]', msg: 'is too long' },
            { loc: 'seed', msg: 'must be an integer' },
            { loc: '', msg: 'the request as a whole' },
        ], target);
        const text = (loc) => root.querySelector(`[data-loc="${loc}"] .field-error`).textContent;
        const placed = { name: text('name'), question: text('questions[1]') };
        const marked = [...root.querySelectorAll('.has-error')].map((node) => node.dataset.loc);
        m.clearFieldErrors(root);
        return {
            prefixes: m.locPrefixes('questions[1].labels[2]'), placed, marked, rest,
            cleared: [...root.querySelectorAll('.field-error')].every((n) => n.hidden && !n.textContent)
                && !root.querySelector('.has-error'),
        };
    }""")
    assert result["prefixes"] == ["questions[1].labels[2]", "questions[1].labels", "questions[1]", "questions"]
    assert result["placed"] == {"name": "is required", "question": "questions[1].labels[2]: is too long"}
    assert result["marked"] == ["questions[1]", "name"]
    assert result["rest"] == [
        {"loc": "seed", "msg": "must be an integer"},
        {"loc": "", "msg": "the request as a whole"},
    ]
    assert result["cleared"]


def test_a_reward_a_probe_games_is_shown_hackable_on_the_registry_and_warned_about_before_launch(
    web_server, page, model_and_reward, researcher, tmp_path
):
    """A probe of a "label anywhere" reward on the dataset (its report as the worker writes it): the registry
    shows which probes game it, and the launch form warns as soon as that reward and dataset are chosen."""
    from posttrain.registry import services
    from posttrain.registry.models import Dataset, RewardProbe
    from rl_engine.reward_probes import build_cases, hackability_report

    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(12)))
    dataset = Dataset.objects.create(
        name="sums",
        sha256="b" * 64,
        format="jsonl",
        path=str(data),
        size_bytes=1,
        row_count=12,
        prompt_field="question",
        label_field="answer",
        columns=["question", "answer"],
    )
    anywhere = services.reward_create(
        "anywhere", "builtin", {"type": "regex", "pattern": r"\d"}, user=researcher, project=default_project()
    )
    cases = build_cases([(f"{i}+1=", str(i + 1), {}) for i in range(12)])
    scores = [float(case.label in case.response) for case in cases]
    RewardProbe.objects.create(
        reward=anywhere,
        dataset=dataset,
        state="done",
        finished_at=timezone.now(),
        result=hackability_report(cases, scores, [[] for _ in cases]),
        examples=[
            {"probe": c.probe, "response": c.response, "score": s}
            for c, s in zip(cases, scores)
            if c.row == cases[0].row
        ],
    )
    log_in(page, web_server, "rosalind", "/registry/")
    open_ready(page, f"{web_server}/registry/")
    page.locator("#reward-rows tr", has_text="anywhere").click()
    report = page.locator("#probe-report")
    expect(report.locator(".alert.critical")).to_contain_text("Hackable: all_labels, label_in_garbage")
    expect(report.locator('tr.flagged[data-probe-name="all_labels"]')).to_contain_text("100%")
    screenshot(page, "registry-probe-report")

    _, exact = model_and_reward
    open_ready(page, f"{web_server}/launch/")
    page.select_option("#exp-dataset", str(dataset.pk))
    page.select_option("#reward-add", str(exact.pk))
    expect(page.locator(f'#reward-rows tr[data-reward="{exact.pk}"] .probe-cell')).to_contain_text("not probed")
    page.select_option("#reward-add", str(anywhere.pk))
    warning = page.locator(f'#probe-warnings .alert[data-reward="{anywhere.pk}"]')
    expect(warning).to_contain_text("Gameable reward: anywhere")
    expect(warning).to_contain_text("all_labels (100%)")
    expect(page.locator(f'#reward-rows tr[data-reward="{anywhere.pk}"] .probe-cell')).to_contain_text("⚠")
    screenshot(page, "launch-probe-warning")
