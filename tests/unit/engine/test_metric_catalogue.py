"""The metric catalogue: one description of every metric, read by the engine, the pages and the README."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rl_engine import metric_catalogue as mc

ROOT = Path(__file__).resolve().parents[3]


def test_the_readmes_metric_table_is_the_catalogues():
    check = subprocess.run(
        [sys.executable, "scripts/metric_table.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr


def test_an_exact_entry_wins_over_a_pattern_and_a_placeholder_is_one_name_part():
    assert mc.lookup("reward/mean").name == "reward/mean"
    assert mc.lookup("reward/std").panel is None  # exact, on demand, though reward/<component> matches it
    assert mc.lookup("reward/exact_match").name == "reward/<component>"
    assert mc.lookup("reward/format/ok").name == "reward/<component>/<log>"
    assert mc.lookup("memory/rollout_0_peak_gb").panel == "memory"
    assert mc.lookup("timing/reward/exact_match").name == "timing/reward/<component>"
    assert mc.lookup("timing/generate").panel == "timing"
    assert mc.lookup("made/up") is None


def test_every_metric_on_a_panel_has_the_panels_unit():
    for metric in mc.METRICS:
        if metric.panel is not None:
            assert metric.unit == next(p.unit for p in mc.PANELS if p.id == metric.panel), metric.name


def test_the_held_out_length_is_not_drawn_on_the_accuracy_axis():
    accuracy, length = mc.lookup("eval/reward/mean"), mc.lookup("eval/response/length_mean")
    assert accuracy.panel != length.panel
    assert length.panel == mc.lookup("response/length_mean").panel


def test_a_metric_in_another_unit_than_its_panel_is_refused():
    panel = mc.Panel("p", "P", "tokens", (mc.Metric("x/rate", "a rate", False, unit="fraction"),))
    with pytest.raises(ValueError, match="x/rate is in fraction but panel 'p' draws tokens"):
        mc.catalogue((panel,), ())


def test_a_metric_listed_twice_is_refused():
    twice = mc.Metric("x/y", "x", True, unit="s")
    with pytest.raises(ValueError, match="metrics listed twice: x/y"):
        mc.catalogue((), (twice, twice))


def test_require_names_the_unknown_metric():
    assert mc.require("kl/mean") == "kl/mean"
    with pytest.raises(KeyError, match="'kl/meen' is not in the metric catalogue"):
        mc.require("kl/meen")


def test_the_headline_metrics_are_the_first_curves_in_catalogue_order():
    assert mc.HEADLINE_METRICS == ("reward/mean", "kl/mean", "policy/entropy", "response/length_mean")


def test_the_browsers_copy_matches_names_as_the_catalogue_does():
    data = mc.catalogue_json()
    assert [p["id"] for p in data["panels"]] == [p.id for p in mc.PANELS]
    by_name = {m["name"]: m for m in data["metrics"]}
    assert by_name["reward/<component>"]["match"] == "^reward/[^/]+$"
    assert by_name["memory/<role>_peak_gb"]["match"] == "^memory/[^/]+_peak_gb$"
    assert by_name["kl/mean"] == {
        "name": "kl/mean",
        "match": "^kl/mean$",
        "exact": True,
        "unit": "nats/token",
        "panel": "kl",
        "higher_is_better": False,
        "headline": True,
        "description": mc.lookup("kl/mean").description,
    }


def test_the_catalogue_needs_neither_torch_nor_django():
    code = "import sys, rl_engine.metric_catalogue; print(sorted({'torch', 'django'} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
