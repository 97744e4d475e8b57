"""The runs list in a real browser: key metrics from summaries, filters kept in the URL, a state badge
that changes live, and two selected runs opened in the compare page."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from tests.e2e.helpers import a_researcher, a_run, an_experiment
from tests.support.browser import log_in, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def row(page, run):
    return page.locator(f'tr[data-run-id="{run.id}"]')


def test_a_researcher_sees_runs_with_metrics_and_filters_them(web_server, page):
    a_researcher("rosalind")
    log_in(page, web_server, "rosalind", next_path="/runs/")
    expect(page.locator(".runs-empty")).to_contain_text("No runs yet")
    screenshot(page, "runs-list-empty")

    experiment = an_experiment("gsm grpo")
    good = a_run(
        experiment,
        "lr 1e-4",
        "succeeded",
        reward=(0.62, 0.71),
        eval_reward=(0.55, 0.58),
        tags=["baseline"],
        finished_at=timezone.now(),
    )
    bad = a_run(experiment, "lr 3e-4 collapsed", "failed", reward=(0.1, 0.4), finished_at=timezone.now())
    live = a_run(experiment, "clip-higher", "running", reward=(0.33, 0.35), tags=["dapo"])
    page.reload()
    expect(page.locator("#runs-table tbody tr")).to_have_count(3)
    good_row = row(page, good)
    expect(good_row.locator(".badge")).to_have_text("succeeded")
    expect(good_row).to_contain_text("grpo")
    expect(good_row).to_contain_text("gsm-mini")
    expect(good_row.locator("td.metric").nth(0)).to_have_text("0.62")  # reward/mean last
    expect(good_row.locator("td.metric").nth(1)).to_have_text("0.71")  # best = max
    expect(good_row.locator("td.metric").nth(2)).to_have_text("0.55best 0.58")  # eval: last, then best
    expect(row(page, bad).locator("td.metric").nth(2)).to_have_text("—")  # no eval logged
    screenshot(page, "runs-list")

    page.check('#state-options input[value="failed"]')
    expect(page.locator("#runs-table tbody tr")).to_have_count(1)
    expect(row(page, bad)).to_be_visible()
    expect(page).to_have_url(re.compile(r"/runs/\?state=failed$"))
    page.reload()  # the filtered view survives a reload (the URL is the state)
    expect(page.locator("#runs-table tbody tr")).to_have_count(1)
    expect(page.locator('#state-options input[value="failed"]')).to_be_checked()

    page.uncheck('#state-options input[value="failed"]')
    expect(page.locator("#runs-table tbody tr")).to_have_count(3)
    page.fill("#filter-search", "clip-higher")
    expect(page.locator("#runs-table tbody tr")).to_have_count(1)
    expect(row(page, live)).to_be_visible()
    expect(page).to_have_url(re.compile(r"search=clip-higher"))
    screenshot(page, "runs-list-search")

    page.fill("#filter-search", "no such run")
    expect(page.locator(".runs-empty")).to_contain_text("No runs match these filters")


def test_a_state_badge_changes_live_and_two_selected_runs_open_compare(web_server, page):
    from posttrain.runs.services import run_transition

    a_researcher("barbara")
    experiment = an_experiment("gsm ppo")
    first = a_run(experiment, "ppo seed 1", "running", reward=(0.3, 0.3))
    second = a_run(experiment, "ppo seed 2", "succeeded", reward=(0.5, 0.6), finished_at=timezone.now())
    log_in(page, web_server, "barbara", next_path="/runs/")
    expect(row(page, first).locator(".badge")).to_have_text("running")

    assert run_transition(first.id, ["running"], "succeeded", "finished in the e2e test")
    # The page polls every 3 s while a visible run is live; no reload here.
    expect(row(page, first).locator(".badge")).to_have_text("succeeded", timeout=10_000)
    screenshot(page, "runs-list-live-badge")

    compare = page.locator("#compare-selected")
    expect(compare).to_be_disabled()
    row(page, first).locator(".select-run").check()
    expect(compare).to_be_disabled()  # one run is not a comparison
    row(page, second).locator(".select-run").check()
    expect(compare).to_be_enabled()
    screenshot(page, "runs-list-selected")
    compare.click()
    page.wait_for_url(f"{web_server}/compare/?runs={first.id},{second.id}")
