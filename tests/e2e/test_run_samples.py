"""The run page's rollout browser in a real browser: a multi-turn sample, stored through the real
ingestion service, opens as its trajectory turn by turn (the model's turns apart from the
environment's answers, each with its reward) with the episode's environment logs."""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest
from playwright.sync_api import expect

from posttrain.runs import services
from posttrain.runs.models import RunState
from tests.e2e.conftest import screenshot
from tests.unit.platform.helpers import make_run, sample_record

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_dispatch", "storage")]

TURNS = [
    {"role": "assistant", "text": "<tool>37 + 48</tool>", "reward": None},
    {"role": "environment", "text": "= 85", "reward": -0.05},
    {"role": "assistant", "text": "The answer is 85", "reward": None},
    {"role": "environment", "text": "correct", "reward": 1.0},
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
    services.events_ingest(
        run.pk,
        [
            {"run": str(run.id), "seq": 1, "type": "status", "step": None, "time": now, "data": {"state": "running"}},
            {
                "run": str(run.id),
                "seq": 2,
                "type": "samples",
                "step": 1,
                "time": now,
                "data": {"samples": [episode, sample_record(1)]},
            },
            {"run": str(run.id), "seq": 3, "type": "status", "step": None, "time": now, "data": {"state": "succeeded"}},
        ],
    )

    page.goto(f"{web_server}/login/?next={quote(f'/runs/{run.id}/')}")
    page.fill("#id_username", "ada")
    page.fill("#id_password", "a-long-passphrase")
    page.click("button[type=submit]")
    page.wait_for_url(f"{web_server}/runs/{run.id}/")
    page.wait_for_selector("body[data-ready=true]")

    # The table tags the multi-turn sample with its number of model turns; the single-turn one has none.
    expect(page.locator('#samples-table tr[data-sample="1:0"] .turns-tag')).to_have_text("2 turns")
    expect(page.locator('#samples-table tr[data-sample="1:1"] .turns-tag')).to_have_count(0)

    page.locator('#samples-table tr[data-sample="1:0"]').click()
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

    # A single-turn sample keeps its plain response.
    page.click("#sample-close")
    page.locator('#samples-table tr[data-sample="1:1"]').click()
    expect(dialog).to_contain_text("Response")
    expect(dialog.locator("li.turn")).to_have_count(0)
