"""The run page's rollout browser in a real browser: a multi-turn sample, stored through the real
ingestion service, opens as its trajectory turn by turn (the model's turns apart from the
environment's answers, each with its reward) with the episode's environment logs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright.sync_api import expect

from posttrain.runs.models import RunState
from posttrain.telemetry.ingestion import events_ingest
from posttrain.telemetry.rollouts import rollout_folder
from tests.support.browser import open_run_page, screenshot
from tests.unit.platform.helpers import make_run, sample_record, samples_event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_dispatch", "storage")]

TURNS = [
    {"role": "assistant", "text": "<tool>37 + 48</tool>", "reward": None},
    {"role": "environment", "text": "= 85", "reward": -0.05},
    {"role": "assistant", "text": "The answer is 85", "reward": None},
    {"role": "environment", "text": "correct", "reward": 1.0},
]
# A verifiers episode with tools: the model's call and the tool's result are labelled as such.
TOOL_TURNS = [
    {
        "role": "assistant",
        "text": '<tool_call>{"name": "calculator_multiply", "arguments": {"a": 6, "b": 7}}</tool_call>',
        "reward": None,
    },
    {"role": "environment", "text": "<tool_response>\n42\n</tool_response>", "reward": 0.0},
    {"role": "assistant", "text": "42", "reward": None},
    {"role": "environment", "text": "", "reward": 1.0},
]


def test_a_multi_turn_sample_opens_turn_by_turn(web_server, page, experiment):
    run = make_run(experiment, RunState.STARTING)
    now = time.time()
    episode = sample_record(
        0,
        prompt="37+48=",
        response="<tool>37 + 48</tool>= 85The answer is 85correct",
        turns=TURNS,
        env={"turns": 2, "env_time_s": 0.01},
        components={"exact_answer": 1.0, "environment": 0.95},
    )
    events_ingest(
        run.pk,
        [
            {"run": str(run.id), "seq": 1, "type": "status", "step": None, "time": now, "data": {"state": "running"}},
            samples_event(run, 2, 1, [sample_record(0)]),  # the step's rollout file, then its event
            samples_event(run, 3, 2, [episode, sample_record(1), sample_record(2, turns=TOOL_TURNS)]),
            {"run": str(run.id), "seq": 4, "type": "status", "step": None, "time": now, "data": {"state": "succeeded"}},
        ],
    )
    # Step 1's file is announced but gone from the store (a lost disk, a bucket's lifecycle rule).
    (Path(rollout_folder(run.id)) / "step_00000001.parquet").unlink()

    open_run_page(page, web_server, run)

    # The missing step is named above the table, not a silent hole in it.
    expect(page.locator("#samples-notice")).to_contain_text("Rollouts missing: step 1 (its rollout file never arrived")
    # The table tags the multi-turn sample with its number of model turns; the single-turn one has none.
    expect(page.locator('#samples-table tr[data-sample="2:0"] .turns-tag')).to_have_text("2 turns")
    expect(page.locator('#samples-table tr[data-sample="2:1"] .turns-tag')).to_have_count(0)

    page.locator('#samples-table tr[data-sample="2:0"]').click()
    dialog = page.locator("#sample-dialog")
    expect(dialog).to_be_visible()
    turns = dialog.locator("li.turn")
    expect(turns).to_have_count(4)
    assert [turns.nth(i).get_attribute("data-role") for i in range(4)] == [t["role"] for t in TURNS]
    expect(turns.locator("pre.sample-text")).to_have_text([t["text"] for t in TURNS])
    expect(turns.nth(0).locator(".turn-head")).to_have_text("model")  # no reward on the model's turns
    expect(turns.nth(1).locator(".turn-head")).to_have_text("environment · reward -0.05")
    expect(turns.nth(3).locator(".turn-head")).to_have_text("environment · reward 1")
    expect(dialog.locator("table.env-logs")).to_contain_text("env_time_s")
    screenshot(page, "run-sample-turns")

    # Whitespace made visible applies to the turns' texts too.
    page.check("#show-special")
    expect(turns.nth(2).locator("pre.sample-text")).to_have_text("The·answer·is·85")
    page.uncheck("#show-special")

    page.keyboard.press("Escape")
    page.locator('#samples-table tr[data-sample="2:2"]').click()
    heads = dialog.locator("li.turn .turn-head")
    expect(heads).to_have_text(["model · 1 tool call", "tool result · reward 0", "model", "environment · reward 1"])

    # A single-turn sample keeps its plain response.
    page.click("#sample-close")
    page.locator('#samples-table tr[data-sample="2:1"]').click()
    expect(dialog).to_contain_text("Response")
    expect(dialog.locator("li.turn")).to_have_count(0)


def test_the_per_token_view_shades_where_the_policies_disagree_and_slides_across_steps(web_server, page, experiment):
    run = make_run(experiment, RunState.STARTING)
    now = time.time()

    def response(step: int, trainer_second: float) -> dict:
        """A rollout with its per-token view, as the engine writes it into the step's file."""
        return sample_record(
            0,
            prompt="40+2=",
            response="42",
            length=3,
            versions=[[step - 1, 3]],
            token_ids=[7, 8, 2],
            token_text=["4", "2", "<eos>"],
            rollout_logprob=[-0.5, -2.0, -0.25],
            trainer_logprob=[-0.5, trainer_second, -0.25],
            entropy=[1.0, 2.5, 0.1],
            token_advantage=[0.5, 0.5, 0.5],
        )

    events_ingest(
        run.pk,
        [
            {"run": str(run.id), "seq": 1, "type": "status", "step": None, "time": now, "data": {"state": "running"}},
            # Step 1: the trainer agrees everywhere; step 2: the second token's log-prob is 1.5 apart.
            *(
                samples_event(run, 1 + step, step, [response(step, trainer)])
                for step, trainer in ((1, -2.0), (2, -0.5))
            ),
        ],
    )

    open_run_page(page, web_server, run)
    page.locator('#samples-table tr[data-sample="2:0"]').click()

    tokens = page.locator("#sample-tokens pre.token-text .tok")
    expect(tokens).to_have_count(3)
    expect(page.locator("#sample-tokens .tok.disagree")).to_have_count(1)
    disagreeing = page.locator('#sample-tokens .tok[data-token="1"]')
    expect(disagreeing).to_have_class("tok disagree")
    title = disagreeing.get_attribute("title")
    assert "rollout log-prob -2" in title and "trainer log-prob -0.5" in title and "difference 1.5" in title
    assert "entropy 2.5" in title and "advantage 0.5" in title and "policy version 1" in title
    expect(page.locator("#sample-tokens .token-position")).to_contain_text("step 2 · sample 0 (2 of 2")
    screenshot(page, "run-sample-tokens")

    # The slider goes back to the same prompt's response at step 1, where the two policies agree.
    page.locator("#token-step-slider").fill("0")
    expect(page.locator("#sample-tokens .token-position")).to_contain_text("step 1 · sample 0 (1 of 2")
    expect(page.locator("#sample-tokens .tok.disagree")).to_have_count(0)


def test_a_hacking_signals_example_link_opens_that_rollout_of_its_step(web_server, page, experiment):
    """A repetition signal at step 8 names the looping rollouts of that step; the looping one past the first
    page of the table opens from the alert, marked as an example."""
    run = make_run(experiment, RunState.STARTING)
    now = time.time()
    rates = [0.05] * 7 + [0.6] * 4  # response/repetition_rate jumps at step 8: the signal's step
    events = [{"run": str(run.id), "seq": 1, "type": "status", "step": None, "time": now, "data": {"state": "running"}}]
    events += [
        {
            "run": str(run.id),
            "seq": step + 1,
            "type": "metrics",
            "step": step,
            "time": now,
            "data": {"response/repetition_rate": r},
        }
        for step, r in enumerate(rates, start=1)
    ]
    responses = [str(i) for i in range(30)]
    responses[27] = "go go go go go go go go go go"
    records = [sample_record(i, prompt=f"q{i}", response=text) for i, text in enumerate(responses)]
    events.append(samples_event(run, 13, 8, records))  # the step's rollout file, then its event
    events_ingest(run.pk, events)

    open_run_page(page, web_server, run)
    alert = page.locator('#alerts .alert[data-code="repetition_rising"]')
    expect(alert).to_contain_text("step 8")
    alert.locator('a[data-example="8:27"]').click()
    dialog = page.locator("#sample-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("go go go go")
    page.click("#sample-close")
    expect(page.locator('#samples-table tr[data-sample="8:27"]')).to_have_class("clickable example")
    screenshot(page, "run-hacking-example")


def test_a_prompt_group_and_one_prompt_across_steps_are_shown_together(web_server, page, experiment):
    """A group number in the table shows that GRPO group of the step alone; a sample's dialog shows its prompt
    across every step; clearing that shows every step's rollouts again."""
    run = make_run(experiment, RunState.STARTING)
    now = time.time()
    prompts_by_step = {1: ["a=", "b="], 2: ["c=", "b="]}  # prompt "b=" is asked again at step 2
    events = [{"run": str(run.id), "seq": 1, "type": "status", "step": None, "time": now, "data": {"state": "running"}}]
    for seq, (step, prompts) in enumerate(prompts_by_step.items(), start=2):
        records = [sample_record(i, prompt=prompts[i // 2], group=i // 2) for i in range(4)]
        events.append(samples_event(run, seq, step, records))
    events_ingest(run.pk, events)

    open_run_page(page, web_server, run)
    rows = page.locator("#samples-table tbody tr[data-sample]")
    expect(rows).to_have_count(4)  # the latest step, followed

    page.locator('#samples-table tr[data-sample="2:2"] .group-link').click()
    expect(rows).to_have_count(2)
    expect(page.locator('#samples-table tr[data-sample="2:3"]')).to_have_count(1)
    expect(page.locator("#sample-dialog")).not_to_be_visible()  # the group link filters; it opens no sample

    page.locator('#samples-table tr[data-sample="2:2"]').click()
    page.click("#same-prompt")
    expect(page.locator("#prompt-filter")).to_be_visible()
    expect(rows).to_have_count(4)
    for sample in ("1:2", "1:3", "2:2", "2:3"):
        expect(page.locator(f'#samples-table tr[data-sample="{sample}"]')).to_have_count(1)
    screenshot(page, "run-prompt-across-steps")

    page.click("#prompt-filter-clear")
    expect(page.locator("#prompt-filter")).to_be_hidden()
    expect(rows).to_have_count(8)  # every step: neither a step nor a prompt is chosen
