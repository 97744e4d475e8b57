"""The compare page in a real browser: two runs with different configs, their metrics and samples
stored through the real ingestion service, compared as a researcher would."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import quote

import pytest

from posttrain.registry.models import Dataset, ModelAsset, RewardFunction
from posttrain.runs import services
from posttrain.runs.models import Run
from posttrain.telemetry.ingestion import events_ingest
from tests.support.browser import screenshot
from tests.unit.platform.helpers import (
    BASE_CONFIG,
    PASSWORD,
    a_researcher,
    default_project,
    registry_rows,
    sample_record,
    samples_event,
)

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = [1, 2, 3, 4, 5]
# Hand-picked curves: the summary table and the smoothing are checked against these numbers.
CURVES = {
    "lr-low": {
        "reward/mean": [0.1, 0.3, 0.2, 0.5, 0.4],
        "kl/mean": [0.01, 0.02, 0.05, 0.03, 0.04],
        "seconds_per_step": 10,
    },
    "lr-high": {
        "reward/mean": [0.2, 0.2, 0.6, 0.7, 0.65],
        "kl/mean": [0.02, 0.04, 0.03, 0.08, 0.06],
        "seconds_per_step": 20,
    },
}
# The two experiments differ in train.lr and their name; the runs also in seed, run folder and rollout folder.
EXPECTED_DIFFERING_FIELDS = {"name", "seed", "train.lr", "logging.run_dir", "logging.rollouts_dir"}
SHARED_PROMPT = "2+2="


def _registry(folder: Path) -> tuple[ModelAsset, Dataset, RewardFunction]:
    rows = registry_rows(folder, [(f"{i}+2=", str(i + 2)) for i in range(8)], sha256="b" * 64)
    return rows["model"], rows["dataset"], rows["exact"]


def _launched_run(name: str, lr: float, seed: int, registry, user) -> Run:
    model, dataset, reward = registry
    config = {**BASE_CONFIG, "train": {**BASE_CONFIG["train"], "lr": lr}}
    experiment = services.experiment_create(
        name=name,
        model=model,
        dataset=dataset,
        rewards=[(reward, 1.0)],
        config=config,
        user=user,
        project=default_project(),
    )
    return services.run_launch(experiment, seed=seed, user=user)


def _ingest_history(run: Run, curve: dict, responses: dict[int, str]) -> None:
    """What the engine would send: running, five metrics steps, samples at steps 3 and 5, succeeded."""
    start = time.time() - 600
    seq = 0

    def event(type_: str, step: int | None, data: dict, at: float) -> dict:
        nonlocal seq
        seq += 1
        return {"run": str(run.id), "seq": seq, "type": type_, "step": step, "time": at, "data": data}

    def rollouts(step: int, records: list[dict], at: float) -> dict:
        """The step's rollout file written into the store, then the samples event naming it."""
        nonlocal seq
        seq += 1
        return {**samples_event(run, seq, step, records), "time": at}

    events = [event("status", None, {"state": "running"}, start)]
    for i, step in enumerate(STEPS):
        events.append(
            event(
                "metrics",
                step,
                {
                    "reward/mean": curve["reward/mean"][i],
                    "kl/mean": curve["kl/mean"][i],
                    "policy/entropy": 1.0 - 0.1 * i,
                    "response/length_mean": 3.0 + i,
                    "progress/samples": 4 * step,
                    "progress/tokens": 12 * step,
                },
                start + curve["seconds_per_step"] * i,
            )
        )
        if step in responses:
            events.append(
                rollouts(
                    step,
                    [
                        sample_record(0, reward=1.0, prompt=SHARED_PROMPT, response=responses[step], label="4"),
                        sample_record(
                            1,
                            reward=0.0,
                            prompt=SHARED_PROMPT,
                            response=f"{responses[step]} (second)",
                            label="4",
                            finish_reason="length",
                            length=4,
                        ),
                        sample_record(2, prompt=f"only in {run.name}"),
                    ],
                    start + curve["seconds_per_step"] * i + 1,
                )
            )
    events.append(event("status", None, {"state": "succeeded"}, start + 300))
    events_ingest(run.pk, events)


def _log_in(page, web_server: str, next_path: str) -> None:
    page.goto(f"{web_server}/login/?next={quote(next_path)}")
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")


def _traces(page, metric: str) -> list[dict]:
    """The plotly traces drawn for a metric: name, role, opacity, x and y."""
    return page.evaluate(
        """(metric) => {
            const div = document.querySelector(`#charts [data-metric="${metric}"]`);
            return (div && div.data || []).map((t) => ({name: t.name, role: t.meta && t.meta.role,
                opacity: t.opacity === undefined ? 1 : t.opacity, x: Array.from(t.x), y: Array.from(t.y)}));
        }""",
        metric,
    )


def _wait_for_traces(page, metric: str, count: int) -> None:
    page.wait_for_function(
        """([metric, count]) => {
            const div = document.querySelector(`#charts [data-metric="${metric}"]`);
            return div && div.data && div.data.length === count;
        }""",
        arg=[metric, count],
        timeout=15_000,
    )


def _cell(page, metric: str, run: Run, column: str) -> str:
    return page.inner_text(f'#summary tr[data-metric="{metric}"][data-run="{run.id}"] td[data-col="{column}"]')


@pytest.fixture
def setup(tmp_path, monkeypatch, storage):
    """A researcher and the registry; runs launch without a Celery worker (they get their events by hand)."""
    from posttrain.core import dispatch

    monkeypatch.setattr(dispatch, "run_task", lambda task_name, run_id: None)
    return a_researcher("ada"), _registry(tmp_path)


def test_two_runs_are_compared_by_curves_config_diff_summary_and_prompts(web_server, page, setup):
    user, registry = setup
    low = _launched_run("sums lr 1e-5", 1e-5, 1, registry, user)
    high = _launched_run("sums lr 3e-5", 3e-5, 2, registry, user)
    _ingest_history(low, CURVES["lr-low"], {3: "4 early low", 5: "4 late low"})
    _ingest_history(high, CURVES["lr-high"], {3: "5 early high", 5: "4 late high"})
    low.refresh_from_db()
    high.refresh_from_db()
    assert low.state == high.state == "succeeded"

    # One run picked: the page says a second one is needed; the picker adds it and the URL follows.
    _log_in(page, web_server, f"/compare/?runs={low.id}")
    page.wait_for_selector("#empty-state .alert")
    assert "pick at least one more run" in page.inner_text("#empty-state")
    page.fill("#run-search", "lr 3e-5")
    page.click(f'#run-results button[data-run="{high.id}"]')
    page.wait_for_selector(f'#run-chips [data-run="{high.id}"] .badge')
    assert f"runs={low.id},{high.id}" in page.url
    assert page.inner_text("#empty-state") == ""

    # Default metrics, one chart each; one trace per run, named after the run.
    page.wait_for_function("document.querySelectorAll('#charts .js-plotly-plot').length === 4", timeout=15_000)
    _wait_for_traces(page, "reward/mean", 2)
    traces = _traces(page, "reward/mean")
    assert [t["name"] for t in traces] == [low.name, high.name]
    assert traces[0]["x"] == STEPS and traces[0]["y"] == CURVES["lr-low"]["reward/mean"]
    # Hovering shows each run's name with its value at that step.
    box = page.locator('#charts [data-metric="reward/mean"] .nsewdrag').bounding_box()
    page.mouse.move(box["x"] + 2, box["y"] + box["height"] / 2)  # step 1, the left edge
    page.wait_for_selector(
        '#charts [data-metric="reward/mean"] .hoverlayer .legend, '
        '#charts [data-metric="reward/mean"] .hoverlayer .hovertext'
    )
    hover = page.eval_on_selector('#charts [data-metric="reward/mean"] .hoverlayer', "layer => layer.textContent")
    assert f"{low.name}: 0.1" in hover and f"{high.name}: 0.2" in hover
    screenshot(page, "compare-two-runs")

    # Smoothing: each run's smoothed line in front of its raw line, which stays, faint.
    page.fill("#smoothing", "0.6")
    _wait_for_traces(page, "reward/mean", 4)
    traces = _traces(page, "reward/mean")
    raw = [t for t in traces if t["role"] == "raw"]
    smoothed = [t for t in traces if t["role"] == "run"]
    assert [t["name"] for t in raw] == [low.name, high.name]
    assert all(t["opacity"] == 0.25 for t in raw)
    assert raw[0]["y"] == CURVES["lr-low"]["reward/mean"]
    # Debiased EMA by hand: 0.1, then (0.6·0.04 + 0.4·0.3) / (1 - 0.6²) = 0.225.
    assert smoothed[0]["y"][:2] == pytest.approx([0.1, 0.225])
    assert "smooth=0.6" in page.url

    # Wall time refetches the series: x is seconds since each run's first metrics event.
    with page.expect_request(lambda r: "/api/compare/?" in r.url and "x=time" in r.url):
        page.select_option("#x-axis", "time")
    page.wait_for_function(
        """() => {
            const div = document.querySelector('#charts [data-metric="reward/mean"]');
            return div && div.layout.xaxis.title.text.startsWith('wall time') && div.data.length === 4;
        }""",
        timeout=15_000,
    )
    by_role = {(t["role"], t["name"]): t for t in _traces(page, "reward/mean")}
    assert by_role[("run", low.name)]["x"] == [0, 10, 20, 30, 40]
    assert by_role[("run", high.name)]["x"] == [0, 20, 40, 60, 80]

    # Settings survive a reload (they live in the query string).
    page.reload()
    _wait_for_traces(page, "reward/mean", 4)
    assert page.input_value("#x-axis") == "time"
    assert page.input_value("#smoothing") == "0.6"

    # Summary: last / best / min / max from the runs' summaries; best is the max of a reward, the min of kl.
    page.wait_for_selector(f'#summary tr[data-metric="kl/mean"][data-run="{high.id}"]')
    assert [_cell(page, "reward/mean", low, c) for c in ("last", "step", "best", "min", "max")] == [
        "0.4",
        "5",
        "0.5",
        "0.1",
        "0.5",
    ]
    assert [_cell(page, "reward/mean", high, c) for c in ("last", "best", "min", "max")] == [
        "0.65",
        "0.7",
        "0.2",
        "0.7",
    ]
    assert [_cell(page, "kl/mean", low, c) for c in ("last", "best", "max")] == ["0.04", "0.01", "0.05"]
    assert [_cell(page, "kl/mean", high, c) for c in ("best", "max")] == ["0.02", "0.08"]

    # Config: only the fields that differ by default, highlighted; every field on demand.
    page.wait_for_selector("#config tr[data-path]")
    differing = page.eval_on_selector_all("#config tr[data-path]", "rows => rows.map(r => r.dataset.path)")
    assert set(differing) == EXPECTED_DIFFERING_FIELDS
    assert page.eval_on_selector_all(
        "#config tr[data-path]", "rows => rows.every(r => r.classList.contains('differs'))"
    )
    lr_cells = page.eval_on_selector_all(
        '#config tr[data-path="train.lr"] td', "cells => cells.map(c => c.textContent)"
    )
    assert lr_cells == ["0.00001", "0.00003"]
    page.locator("#config").scroll_into_view_if_needed()
    screenshot(page, "compare-config-diff")
    page.uncheck("#only-differing")
    page.wait_for_selector('#config tr[data-path="train.steps"]')
    all_rows = page.eval_on_selector_all(
        "#config tr[data-path]", "rows => rows.map(r => [r.dataset.path, r.className])"
    )
    assert len(all_rows) > 20
    assert {path for path, cls in all_rows if cls == "differs"} == EXPECTED_DIFFERING_FIELDS
    assert "fields=all" in page.url
    page.check("#only-differing")

    # The same prompt side by side: only prompts every run saw are offered; one column per run.
    page.wait_for_selector("#prompt-list button.prompt-option")
    offered = page.eval_on_selector_all("#prompt-list button.prompt-option", "bs => bs.map(b => b.title)")
    assert offered == [SHARED_PROMPT]
    page.click("#prompt-list button.prompt-option")
    page.wait_for_selector("#samples .sample-column")
    columns = page.locator("#samples .sample-column")
    assert columns.count() == 2
    assert columns.nth(0).get_attribute("data-run") == str(low.id)
    assert "4 late low" in columns.nth(0).inner_text() and "4 late high" in columns.nth(1).inner_text()
    assert "length" in columns.nth(0).inner_text()  # the second sample's finish reason
    page.fill("#sample-step", "3")
    page.dispatch_event("#sample-step", "change")
    page.wait_for_function("document.querySelector('#samples').innerText.includes('5 early high')", timeout=15_000)
    assert "4 early low" in columns.nth(0).inner_text()
    assert "step=3" in page.url
    page.locator("#samples").scroll_into_view_if_needed()
    screenshot(page, "compare-side-by-side")


def test_runs_grouped_by_a_config_field_show_each_group_mean_and_band(web_server, page, setup):
    user, registry = setup
    first = _launched_run("sums lr 1e-5", 1e-5, 1, registry, user)
    second = services.run_clone(first, seed=2, user=user)  # the same lr, another seed
    other = _launched_run("sums lr 3e-5", 3e-5, 3, registry, user)
    _ingest_history(first, CURVES["lr-low"], {})
    _ingest_history(second, {**CURVES["lr-low"], "reward/mean": [0.3, 0.1, 0.4, 0.5, 0.6]}, {})
    _ingest_history(other, CURVES["lr-high"], {})

    _log_in(page, web_server, f"/compare/?runs={first.id},{second.id},{other.id}&metrics=reward/mean&group=train.lr")
    page.wait_for_function(
        """() => { const div = document.querySelector('#charts [data-metric="reward/mean"]');
                   return div && div.data && div.data.some((t) => t.meta && t.meta.role === 'mean'); }""",
        timeout=15_000,
    )
    traces = _traces(page, "reward/mean")
    # Each run stays visible, faint and thin, with its group's colour; per group a band and a mean.
    runs = [t for t in traces if t["role"] == "run"]
    assert [t["name"] for t in runs] == [first.name, second.name, other.name]
    assert all(t["opacity"] < 0.5 for t in runs)
    means = [t for t in traces if t["role"] == "mean"]
    assert [t["name"] for t in means] == ["train.lr = 0.00001: mean of 2", "train.lr = 0.00003: mean of 1"]
    # Both runs of the first group log at steps 1..5, so the mean and band are plain per-step numbers.
    assert means[0]["x"] == STEPS
    assert means[0]["y"] == pytest.approx([0.2, 0.2, 0.3, 0.5, 0.5])
    (lower,) = [t for t in traces if t["role"] == "band-lower" and t["name"].startswith("train.lr = 0.00001")]
    upper = traces[traces.index(lower) - 1]  # the band fills from its lower edge up to the trace before it
    assert lower["name"] == "train.lr = 0.00001 (min–max)"
    assert lower["y"] == pytest.approx([0.1, 0.1, 0.2, 0.5, 0.4])
    assert upper["role"] == "band-upper" and upper["y"] == pytest.approx([0.3, 0.3, 0.4, 0.5, 0.6])
    assert page.inner_text(f'#run-chips [data-run="{second.id}"] .tag') == "0.00001"
    screenshot(page, "compare-grouped")

    page.select_option("#band", "std")
    page.wait_for_function(
        """() => document.querySelector('#charts [data-metric="reward/mean"]').data
                   .some((t) => (t.name || '').endsWith('(±1 std)'))""",
        timeout=15_000,
    )
    assert "band=std" in page.url
    page.select_option("#group-by", "")
    _wait_for_traces(page, "reward/mean", 3)
    assert "group=" not in page.url


def test_the_compare_math_matches_hand_computed_values(web_server, page):
    """The EMA and group aggregation are plain functions of compare.js, checked in the browser that runs them."""
    a_researcher("ada")
    _log_in(page, web_server, "/compare/")
    page.wait_for_selector("#empty-state .alert")
    assert "Pick at least two runs" in page.inner_text("#empty-state")
    result = page.evaluate("""async () => {
        const m = await import('/static/js/compare.js');
        return {
            ema: m.emaSmooth([1, null, 3], 0.5),
            unsmoothed: m.emaSmooth([1, NaN, 3], 0),
            minmax: m.aggregateGroup([{x: [0, 2], y: [0, 2]}, {x: [1, 2], y: [4, 6]}], 'minmax'),
            std: m.aggregateGroup([{x: [0, 2], y: [0, 2]}, {x: [1, 2], y: [4, 6]}], 'std'),
            goals: ['reward/mean', 'eval/accuracy', 'kl/mean', 'policy/loss', 'response/length_mean',
                    'timing/train'].map(m.metricGoal),
            flat: m.flattenConfig({train: {lr: 1e-5, betas: [0.9, 0.99]}, rewards: [{name: 'a'}], stop: []}),
            diff: [...m.configPaths([{a: 1, b: 2}, {a: 1, b: 3, c: 4}]).differing],
        };
    }""")
    assert result["ema"] == pytest.approx([1, None, 7 / 3])  # (0.25·1 + 0.5·3) / (1 - 0.25)
    assert result["unsmoothed"] == [1, None, 3]
    # Run 1 covers x 0..2, run 2 covers 1..2: at x=0 only run 1 counts; at x=1 run 1 is interpolated.
    assert result["minmax"] == {
        "x": [0, 1, 2],
        "mean": [0, 2.5, 4],
        "lower": [0, 1, 2],
        "upper": [0, 4, 6],
        "count": [1, 2, 2],
    }
    spread = 2**0.5 * 1.5  # sample std of {1, 4}
    assert result["std"]["lower"] == pytest.approx([0, 2.5 - spread, 4 - 2 * 2**0.5])
    assert result["goals"] == ["max", "max", "min", "min", "min", "min"]
    assert result["flat"] == {"train.lr": 1e-5, "train.betas": [0.9, 0.99], "rewards.0.name": "a", "stop": []}
    assert result["diff"] == ["b", "c"]


def test_an_api_error_is_shown_in_the_page(web_server, page):
    a_researcher("ada")
    _log_in(page, web_server, "/compare/?runs=not-a-run,also-not")
    page.wait_for_selector("#compare-error [role=alert]")
    assert "not a run id" in page.inner_text("#compare-error")


def test_curves_of_runs_still_going_grow_on_the_compare_page_without_a_reload(web_server, page, setup):
    user, registry = setup
    done = _launched_run("sums finished", 1e-5, 1, registry, user)
    going = _launched_run("sums going", 3e-5, 2, registry, user)
    _ingest_history(done, CURVES["lr-low"], {})
    events_ingest(
        going.pk,
        [
            {
                "run": str(going.id),
                "seq": 1,
                "type": "status",
                "step": None,
                "time": time.time(),
                "data": {"state": "running"},
            },
            {
                "run": str(going.id),
                "seq": 2,
                "type": "metrics",
                "step": 1,
                "time": time.time(),
                "data": {"reward/mean": 0.1},
            },
        ],
    )
    _log_in(page, web_server, f"/compare/?runs={done.id},{going.id}")
    _wait_for_traces(page, "reward/mean", 2)
    page.evaluate("window.__sameDocument = true")
    assert [len(t["x"]) for t in _traces(page, "reward/mean")] == [5, 1]

    events_ingest(
        going.pk,
        [
            {
                "run": str(going.id),
                "seq": 3,
                "type": "metrics",
                "step": 2,
                "time": time.time(),
                "data": {"reward/mean": 0.3},
            },
        ],
    )
    page.wait_for_function(  # the page re-reads every 10 s while a run is not finished
        """() => { const d = document.querySelector('#charts [data-metric="reward/mean"]');
                   return d && d.data.length === 2 && d.data[1].x.length === 2; }""",
        timeout=30_000,
    )
    assert _traces(page, "reward/mean")[1]["y"] == [0.1, 0.3]
    assert page.evaluate("window.__sameDocument") is True
