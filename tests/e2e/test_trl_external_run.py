"""A real TRL GRPOTrainer run on the demo task (the tiny Qwen2 policy, two-digit addition, exact match)
with Posttrain's callback lands as an external run with every step's metrics, renamed to Posttrain's,
and every logged completion as a sample; its run page shows the standard curves and the rollouts in
headless Chromium."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.support.browser import PASSWORD, log_in, screenshot
from tests.unit.platform.helpers import join

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STEPS = 4
PROMPTS, GENERATIONS = 2, 4


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    from rl_engine.demo.build import build_demo

    out = tmp_path_factory.mktemp("trl-demo")
    build_demo(out, seed=0, model_size="tiny", sft_steps=10, progress=False)
    return out


def trl_grpo_run(demo: Path, output: Path, callback_for) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from trl import GRPOConfig, GRPOTrainer

    from rl_engine.demo.task import read_jsonl

    def exact(prompts: list[str], completions: list[str], label: list[str], **_) -> list[float]:
        return [float(c.strip() == str(answer)) for c, answer in zip(completions, label)]

    def digits(completions: list[str], **_) -> list[float]:  # the share of digits: differs between samples
        return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

    args = GRPOConfig(
        output_dir=str(output),
        use_cpu=True,
        seed=0,
        report_to=[],
        gradient_checkpointing=False,
        learning_rate=1e-3,
        beta=0.04,
        num_generations=GENERATIONS,
        per_device_train_batch_size=PROMPTS * GENERATIONS,
        generation_batch_size=PROMPTS * GENERATIONS,
        max_completion_length=4,
        max_steps=STEPS,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        reward_weights=[1.0, 0.5],
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(demo / "model"),
        reward_funcs=[exact, digits],
        args=args,
        train_dataset=Dataset.from_list(read_jsonl(demo / "data" / "train.jsonl")[:64]),
        processing_class=AutoTokenizer.from_pretrained(demo / "model"),
    )
    trainer.add_callback(callback_for(trainer))
    trainer.train()


def test_a_trl_grpo_run_with_the_callback_shows_on_its_run_page(web_server, page, demo, tmp_path, storage):
    from posttrain.accounts.services import token_get_or_create, user_create
    from posttrain.runs.models import Run
    from posttrain.telemetry.rollouts import rollouts_query
    from posttrain_sdk.integrations.trl import PosttrainCallback

    user = join(user_create("ada", PASSWORD, "researcher"))  # a member of the default project, her only one
    token = token_get_or_create(user).key
    callbacks: list[PosttrainCallback] = []

    def callback_for(trainer):
        callbacks.append(
            PosttrainCallback(trainer, experiment="addition trl", url=web_server, token=token, dir=tmp_path / "runs")
        )
        return callbacks[0]

    trl_grpo_run(demo, tmp_path / "trl", callback_for)
    tracked = callbacks[0].run
    assert tracked.finished and tracked.delivered

    run = Run.objects.get(pk=tracked.id)
    assert (run.state, run.kind, run.engine, run.total_steps, run.last_step) == ("succeeded", "external", "trl", 4, 4)
    assert run.resolved_config["num_generations"] == GENERATIONS and run.resolved_config["trainer"] == "GRPOTrainer"
    rows = list(run.metric_rows.order_by("step"))
    assert [r.step for r in rows if "reward/mean" in r.values] == [1, 2, 3, 4]  # every step, TRL's reward renamed
    for name in ("kl/mean", "policy/entropy", "response/length_mean", "response/truncated_rate", "reward/exact"):
        assert all(name in r.values for r in rows if "reward/mean" in r.values), name
    # Each step's completions went up as a rollout file (the SDK's sender) into the web server's store.
    assert sorted(run.rollout_files.values_list("step", "rows")) == [
        (step, PROMPTS * GENERATIONS) for step in (1, 2, 3, 4)
    ]
    samples = list(rollouts_query([run.pk]))
    assert len(samples) == STEPS * PROMPTS * GENERATIONS
    assert {s["step"] for s in samples} == {1, 2, 3, 4} and {s["group"] for s in samples} == {0, 1}
    for s in samples:
        assert set(s["components"]) == {"exact", "digits"}
        assert s["reward"] == pytest.approx(s["components"]["exact"] + 0.5 * s["components"]["digits"])
        assert s["advantage"] is not None and 0 <= s["length"] <= 4
    assert len({s["reward"] for s in samples}) > 1
    first_step = [r for r in rows if r.step == 1 and "reward/mean" in r.values][0]
    step_rewards = [s["reward"] for s in samples if s["step"] == 1]
    assert first_step.values["reward/mean"] == pytest.approx(sum(step_rewards) / len(step_rewards))

    log_in(page, web_server, "ada", f"/runs/{run.id}/")
    page.wait_for_selector("body[data-ready=true]")
    expect(page.locator("#run-state")).to_have_text("succeeded")
    expect(page.locator("#run-engine")).to_have_text("external · trl")
    for panel in ("reward", "kl", "entropy", "length"):
        expect(page.locator(f'[data-panel="{panel}"] .scatterlayer .trace')).not_to_have_count(0)
    expect(page.locator('#samples-table tr[data-sample^="4:"]')).to_have_count(PROMPTS * GENERATIONS)
    screenshot(page, "trl-external-run")
