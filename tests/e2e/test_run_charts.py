"""The run page's panels in a real browser, drawn from the metric catalogue: one unit per panel (the
held-out length is not squashed onto the accuracy's 0-1 axis), headline panels from the start, and a
metric the catalogue does not know only on demand."""

from __future__ import annotations

import time

import pytest

from posttrain.runs.models import RunState
from posttrain.telemetry.ingestion import events_ingest
from tests.support.browser import open_run_page, screenshot
from tests.unit.platform.helpers import make_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_dispatch", "storage")]

STEP = {
    "reward/mean": 0.5,
    "reward/exact_match": 0.5,
    "response/length_mean": 3.5,
    "eval/reward/mean": 0.25,
    "eval/response/length_mean": 3.4,
    "eval/size": 16.0,
    "timing/generate": 0.2,
    "timing/train": 0.1,
    "timing/step": 0.4,
    "memory/driver_peak_gb": 1.5,
    "custom/thing": 7.0,
}

TRACES = """(id) => { const div = document.getElementById(id); return div && div.data ? div.data.map((t) => t.name) : null; }"""


def test_panels_come_from_the_catalogue_one_unit_each(web_server, page, experiment):
    run = make_run(experiment, RunState.RUNNING)
    now = time.time()
    events_ingest(run.pk, [{"run": str(run.id), "seq": 1, "type": "metrics", "step": 1, "time": now, "data": STEP}])
    open_run_page(page, web_server, run)
    page.wait_for_function(f"() => ({TRACES})('chart-eval') !== null")

    assert page.evaluate(TRACES, "chart-eval") == ["eval/reward/mean"]
    assert set(page.evaluate(TRACES, "chart-length")) == {"response/length_mean", "eval/response/length_mean"}
    assert set(page.evaluate(TRACES, "chart-reward")) == {"reward/mean", "reward/exact_match"}
    assert set(page.evaluate(TRACES, "chart-timing")) == {"generate", "train"}  # timing/step: on demand
    assert page.evaluate(TRACES, "chart-memory") == ["memory/driver_peak_gb"]
    # Headline metrics get their panel before they have a point; unknown metrics wait to be asked for.
    assert page.evaluate(TRACES, "chart-kl") == ["kl/mean"] and page.evaluate(TRACES, "chart-entropy")
    drawn = page.evaluate("() => [...document.querySelectorAll('#charts .chart')].map((d) => d.dataset.panel)")
    assert not any("custom" in panel or "eval/size" in panel for panel in drawn), drawn
    assert page.locator('#extra-metric option[value="custom/thing"]').count() == 1
    screenshot(page, "run-charts-by-unit")


STABILITY_STEP = {
    "rollout_corr/k3_kl": 0.002,
    "rollout_corr/weight_p05": 0.8,
    "rollout_corr/weight_p95": 1.3,
    "rollout_corr/masked_fraction": 0.01,
    "policy/entropy": 1.2,
    "policy/clip_ratio": 0.05,
    "policy/grad_norm": 0.7,
    "staleness/mean": 1.5,
    "staleness/share_0": 0.25,
    "staleness/share_4": 0.75,
}


def test_the_stability_view_groups_mismatch_weights_entropy_clipping_grad_norm_and_staleness(
    web_server, page, experiment
):
    run = make_run(experiment, RunState.RUNNING)
    events_ingest(
        run.pk,
        [{"run": str(run.id), "seq": 1, "type": "metrics", "step": 1, "time": time.time(), "data": STABILITY_STEP}],
    )
    open_run_page(page, web_server, run)
    page.wait_for_function(f"() => ({TRACES})('chart-staleness_share') !== null")

    group = "#panel-group-stability .chart"
    drawn = page.evaluate(f"() => [...document.querySelectorAll('{group}')].map((d) => d.dataset.panel)")
    for panel in ("rollout_corr", "rollout_corr_weights", "rollout_corr_dropped", "entropy", "clip", "grad_norm"):
        assert panel in drawn, (panel, drawn)
    # The staleness distribution: one bar series per lag.
    assert set(page.evaluate(TRACES, "chart-staleness_share")) >= {"staleness/share_0", "staleness/share_4"}
    assert "staleness/mean" in page.evaluate(TRACES, "chart-staleness")
    screenshot(page, "run-stability-view")


# Where each chart of the stability group sits: the group's box and its charts by row (the same top).
GROUP_ROWS = """() => {
  const box = document.querySelector("#panel-group-stability .panel-group-charts").getBoundingClientRect();
  const rows = new Map();
  for (const div of document.querySelectorAll("#panel-group-stability .chart")) {
    const r = div.getBoundingClientRect();
    const svg = div.querySelector(".main-svg");
    const row = rows.get(Math.round(r.top)) || [];
    row.push({ panel: div.dataset.panel, left: r.left, right: r.right, width: r.width, plot: svg ? svg.getBoundingClientRect().width : 0 });
    rows.set(Math.round(r.top), row);
  }
  return { left: box.left, right: box.right, rows: [...rows.entries()].sort((a, b) => a[0] - b[0]).map((e) => e[1]) };
}"""
PLOTS_FIT = f"() => ({GROUP_ROWS})().rows.flat().every((c) => Math.abs(c.plot - c.width) <= 2)"


def assert_rows_fill_the_group(layout: dict) -> None:
    for row in layout["rows"]:
        left, right = min(c["left"] for c in row), max(c["right"] for c in row)
        assert abs(left - layout["left"]) <= 1 and abs(right - layout["right"]) <= 1, layout


def test_no_row_of_the_stability_group_is_left_half_empty(web_server, page, experiment):
    """The demo run's stability metrics (entropy, clipping, gradient norm): where two charts fit a row, the
    gradient norm's, alone on the second, takes the whole row, and every plot is redrawn at its chart's width."""
    run = make_run(experiment, RunState.RUNNING)
    data = {"policy/entropy": 1.2, "policy/clip_ratio": 0.05, "policy/grad_norm": 0.7}
    events_ingest(
        run.pk, [{"run": str(run.id), "seq": 1, "type": "metrics", "step": 1, "time": time.time(), "data": data}]
    )
    page.set_viewport_size({"width": 1000, "height": 860})
    open_run_page(page, web_server, run)
    page.wait_for_function(f"() => ({TRACES})('chart-grad_norm') !== null")
    page.wait_for_function(PLOTS_FIT)

    layout = page.evaluate(GROUP_ROWS)
    assert [len(row) for row in layout["rows"]] == [2, 1], layout
    assert [c["panel"] for c in layout["rows"][1]] == ["grad_norm"]
    assert_rows_fill_the_group(layout)

    page.set_viewport_size({"width": 1400, "height": 860})  # all three fit one row
    page.wait_for_function(f"() => ({GROUP_ROWS})().rows.length === 1")
    page.wait_for_function(PLOTS_FIT)
    assert_rows_fill_the_group(page.evaluate(GROUP_ROWS))
    screenshot(page, "run-stability-rows")
