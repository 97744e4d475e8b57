"""Diagnostics rules on small hand-built series (each expected step worked out by hand in a comment),
and the alerts endpoint over stored metric rows."""

from __future__ import annotations

import math
import operator

import pytest

from posttrain.runs import diagnostics as d
from posttrain.runs.models import RunState
from posttrain.telemetry.models import MetricRow
from tests.unit.platform.helpers import make_run, unknown_run_id


def series(*values, start: int = 1) -> tuple[list[int], list]:
    """Values at consecutive steps from `start`."""
    return list(range(start, start + len(values))), list(values)


def codes(alerts: list[d.Alert]) -> list[tuple[str, str, int]]:
    return [(a.code, a.metric, a.step) for a in alerts]


# Healthy-looking noise, reused by several rules: wobbles around a level with no trend.
WOBBLE = [1.0, 1.1, 0.9, 1.05, 0.95, 1.1, 0.9, 1.0, 1.08, 0.92, 1.02, 0.98]


# --- NaN / Inf ---------------------------------------------------------------------------------


def test_a_nan_loss_is_critical_at_its_first_step():
    alerts = d.diagnose({"policy/loss": series(0.5, 0.4, None, 0.3, float("nan"))})
    assert codes(alerts) == [("nonfinite", "policy/loss", 3)]
    assert alerts[0].severity == "critical" and alerts[0].value is None
    assert "2 non-finite points" in alerts[0].message


def test_an_infinite_grad_norm_and_kl_each_raise_their_own_alert():
    alerts = d.diagnose(
        {
            "policy/grad_norm": ([10, 20, 30], [1.0, float("inf"), 2.0]),
            "kl/mean": ([10, 20, 30], [0.0, 0.01, float("-inf")]),
        }
    )
    assert codes(alerts) == [("nonfinite", "policy/grad_norm", 20), ("nonfinite", "kl/mean", 30)]


def test_a_nan_in_a_metric_that_is_not_a_loss_is_not_a_divergence_alert():
    assert d.diagnose({"reward/mean": series(0.1, None, 0.2), "timing/step": series(None)}) == []


# --- failing rewards ---------------------------------------------------------------------------


def test_any_failed_reward_is_critical_at_the_first_step_that_had_one():
    # Steps 1-2 scored every sample; step 3 had 2 failures, step 5 had 1: the alert is at step 3, 3 in all.
    alerts = d.diagnose({"reward/errors": series(0.0, 0.0, 2.0, 0.0, 1.0)})
    assert codes(alerts) == [("reward_errors", "reward/errors", 3)]
    assert alerts[0].severity == "critical" and alerts[0].value == 2.0
    assert alerts[0].message.startswith("2 sample(s) of step 3 scored 0 because a reward failed (3 over 2 steps")


def test_a_reward_that_never_failed_raises_nothing():
    assert d.diagnose({"reward/errors": series(0.0, 0.0, None, 0.0)}) == []


# --- KL ----------------------------------------------------------------------------------------


def test_kl_blowup_fires_at_the_first_of_three_points_above_the_floor():
    # early level = median(0, .01, .02, .01, .02) = .01; limit = max(10 × .01, 1.0) = 1.0;
    # above it: steps 8 (1.5), 9, 10, ... -> step 8.
    kl = series(0.0, 0.01, 0.02, 0.01, 0.02, 0.03, 0.5, 1.5, 2.0, 3.0, 4.0, 5.0)
    alerts = d.diagnose({"kl/mean": kl})
    assert codes(alerts) == [("kl_blowup", "kl/mean", 8)]
    assert alerts[0].severity == "critical" and alerts[0].value == 1.5
    assert "1.5" in alerts[0].message and "0.01" in alerts[0].message


def test_kl_spikes_shorter_than_three_steps_are_noise():
    # a one-step spike at 6, then a two-step one at 10-11: no three in a row above 1.0.
    kl = series(0.01, 0.01, 0.02, 0.01, 0.02, 5.0, 0.02, 0.02, 0.03, 4.0, 4.0, 0.01)
    assert d.diagnose({"kl/mean": kl}) == []


def test_approx_kl_is_judged_against_ten_times_a_high_early_level():
    # early level .05 -> limit max(.5, .1) = .5: .3 for many steps is above the floor but not a blow-up.
    steady_high = series(0.05, 0.04, 0.06, 0.05, 0.05, *[0.3] * 6)
    assert d.diagnose({"policy/approx_kl": steady_high}) == []
    # .6 from step 8 on: fires at step 8.
    blowing_up = series(0.05, 0.04, 0.06, 0.05, 0.05, 0.3, 0.3, 0.6, 0.7, 0.8)
    assert codes(d.diagnose({"policy/approx_kl": blowing_up})) == [("kl_blowup", "policy/approx_kl", 8)]


def test_kl_is_not_judged_before_the_early_level_exists():
    assert d.diagnose({"kl/mean": series(0.0, 5.0, 5.0, 5.0)}) == []


def test_non_finite_kl_points_are_skipped_by_the_blowup_rule():
    # steps 6 and 8 are NaN; the finite points above 1.0 (7, 9, 10) are consecutive finite points -> step 7.
    kl = series(0.0, 0.0, 0.0, 0.0, 0.0, None, 2.0, None, 2.0, 2.0)
    assert codes(d.diagnose({"kl/mean": kl})) == [("nonfinite", "kl/mean", 6), ("kl_blowup", "kl/mean", 7)]


# --- rollout / trainer mismatch ------------------------------------------------------------------


def test_mismatch_kl_leaving_its_early_range_is_the_off_policy_warning():
    # early level = median(.002, .003, .002, .004, .003) = .003; limit = max(5 × .003, 1e-3) = .015;
    # a one-step spike at 6 is noise; above it from step 8 (.02, .03, .05) -> step 8.
    kl = series(0.002, 0.003, 0.002, 0.004, 0.003, 0.02, 0.004, 0.02, 0.03, 0.05)
    alerts = d.diagnose({"rollout_corr/k3_kl": kl})
    assert codes(alerts) == [("mismatch_kl_rising", "rollout_corr/k3_kl", 8)]
    assert alerts[0].severity == "warning" and "max_staleness" in alerts[0].message


def test_a_mismatch_that_starts_at_zero_rises_past_the_floor_before_it_alerts():
    # early level 0 -> limit = the floor, 1e-3: 5e-4 for many steps is harmless.
    assert d.diagnose({"rollout_corr/k3_kl": series(0.0, 0.0, 0.0, 0.0, 0.0, *[5e-4] * 6)}) == []


# --- entropy -----------------------------------------------------------------------------------


def test_entropy_collapse_fires_where_the_fall_persists():
    # early level = median(1.0, 1.2, 1.1, .9, 1.0) = 1.0; limit .1. Below it: 8, 9, then 10 (.2) breaks
    # the streak; 11, 12, 13 -> step 11.
    entropy = series(1.0, 1.2, 1.1, 0.9, 1.0, 0.8, 0.5, 0.09, 0.05, 0.2, 0.08, 0.07, 0.06)
    alerts = d.diagnose({"policy/entropy": entropy})
    assert codes(alerts) == [("entropy_collapse", "policy/entropy", 11)]
    assert alerts[0].severity == "warning" and alerts[0].value == 0.08


def test_entropy_that_falls_gradually_by_half_is_healthy():
    assert d.diagnose({"policy/entropy": series(1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5)}) == []


def test_entropy_blowing_up_to_the_uniform_maximum_in_three_steps_is_critical():
    # The demo vocabulary has 248 tokens: uniform sampling is ln 248 = 5.51 nats. Early level =
    # median(.49, .5, .48, .49, .5) = .49; limit = max(3 x .49, .49 + 1) = 1.49. Steps 7, 8, 9 climb
    # past it (2.3, 4.2, 5.51) and the policy stays there -> step 7.
    entropy = series(0.49, 0.5, 0.48, 0.49, 0.5, 0.49, 2.3, 4.2, 5.51, 5.51, 5.5)
    alerts = d.diagnose({"policy/entropy": entropy})
    assert codes(alerts) == [("entropy_blowup", "policy/entropy", 7)]
    assert alerts[0].severity == "critical" and alerts[0].value == 2.3
    assert "0.49" in alerts[0].message and "1.49" in alerts[0].message


def test_an_entropy_spike_or_a_small_rise_from_near_zero_is_not_a_blowup():
    # One spike (step 7) does not persist; a near-deterministic policy moving from .05 to .2 is 4x its
    # early level but not 1 nat above it.
    assert d.diagnose({"policy/entropy": series(0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 3.0, 0.6, 0.5, 0.5)}) == []
    assert d.diagnose({"policy/entropy": series(0.05, 0.05, 0.05, 0.05, 0.05, 0.2, 0.2, 0.2, 0.2)}) == []


# --- response length and truncation ------------------------------------------------------------


def test_length_runaway_fires_over_three_times_the_early_level():
    # early = median(100, 110, 90, 100, 105) = 100; limit 300: 7 (310) alone, 8 (290) breaks; 9, 10, 11 -> 9.
    lengths = series(100, 110, 90, 100, 105, 200, 310, 290, 320, 330, 350)
    alerts = d.diagnose({"response/length_mean": lengths})
    assert codes(alerts) == [("length_runaway", "response/length_mean", 9)]
    assert alerts[0].value == 320


def test_truncation_rising_fires_above_the_level_and_the_early_rate():
    # early = median(0, .05, 0, .02, .01) = .01; limit max(.2, .11) = .2: steps 7, 8, 9 -> 7.
    truncated = series(0.0, 0.05, 0.0, 0.02, 0.01, 0.1, 0.25, 0.3, 0.4)
    assert codes(d.diagnose({"response/truncated_rate": truncated})) == [
        ("truncation_rising", "response/truncated_rate", 7)
    ]


def test_truncation_that_was_high_from_the_start_is_not_rising():
    # early .5 -> limit .6, never reached.
    assert d.diagnose({"response/truncated_rate": series(0.5, 0.45, 0.55, 0.5, 0.5, 0.52, 0.55, 0.5, 0.58)}) == []


# --- reward saturation while length shifts ------------------------------------------------------


def saturating_reward(last_step: int) -> list[float]:
    # .1 at step 1 rising by .1 to .9 at step 9, then flat at .9.
    return [round(0.1 * min(step, 9), 2) for step in range(1, last_step + 1)]


def test_saturated_reward_with_growing_length_fires_at_the_end_of_the_first_window():
    # best .9, worst .1: near-best means >= .9 - .1 × .8 = .82, so a window is steps >= 9 only.
    # length 100 to step 14, then +10 per step (15: 110 ... 22: 180).
    # window 9-18: edges median(100,100,100) vs median(120,130,140) = 130 -> +30%, no;
    # window 10-19: 100 vs 140 -> +40%, no; window 11-20: 100 vs median(140,150,160) = 150 -> +50% -> step 20.
    lengths = [100] * 14 + [110, 120, 130, 140, 150, 160, 170, 180]
    alerts = d.diagnose({"reward/mean": series(*saturating_reward(22)), "response/length_mean": series(*lengths)})
    assert codes(alerts) == [("reward_saturation_length_shift", "reward/mean", 20)]
    assert alerts[0].severity == "warning" and alerts[0].value == 0.9
    assert "steps 11–20" in alerts[0].message and "from 100 to 150" in alerts[0].message


def test_a_shrinking_length_under_a_saturated_reward_also_fires():
    # length 100 to step 12, then 80, 60, 40, 40, ...: window 9-18 edges median(100,100,100) vs
    # median(40,40,40) -> -60% -> fires at the first window, step 18.
    lengths = [100] * 12 + [80, 60, 40, 40, 40, 40, 40, 40]
    alerts = d.diagnose({"reward/mean": series(*saturating_reward(20)), "response/length_mean": series(*lengths)})
    assert codes(alerts) == [("reward_saturation_length_shift", "reward/mean", 18)]


def test_a_saturated_reward_with_a_steady_length_is_healthy():
    lengths = [100 * w for w in WOBBLE + WOBBLE]  # ±10% noise, no trend
    assert d.diagnose({"reward/mean": series(*saturating_reward(24)), "response/length_mean": series(*lengths)}) == []


def test_a_reward_still_rising_while_length_grows_is_learning_not_hacking():
    # reward +.05 per step: a 10-step window spans .45 of reward, never all within 10% of the range from
    # the best. length 110 ... 300: early 130, limit 390, so no runaway either.
    rewards = [0.05 * step for step in range(1, 21)]
    lengths = [100 + 10 * step for step in range(1, 21)]
    assert d.diagnose({"reward/mean": series(*rewards), "response/length_mean": series(*lengths)}) == []


def test_a_reward_that_never_moved_is_not_saturated():
    lengths = [100] * 5 + [200] * 15
    alerts = d.diagnose({"reward/mean": series(*[0.5] * 20), "response/length_mean": series(*lengths)})
    assert all(a.code != "reward_saturation_length_shift" for a in alerts)


# --- all rules together ------------------------------------------------------------------------


def test_a_healthy_noisy_run_raises_nothing():
    n = len(WOBBLE)
    healthy = {
        "policy/loss": series(*[0.1 * w for w in WOBBLE]),
        "kl/mean": series(*[0.02 * w * (1 + i / n) for i, w in enumerate(WOBBLE)]),
        "policy/approx_kl": series(*[0.01 * w for w in WOBBLE]),
        "policy/grad_norm": series(*[2 * w for w in WOBBLE]),
        "policy/entropy": series(*[1.5 * w * (1 - i / (2 * n)) for i, w in enumerate(WOBBLE)]),
        "response/length_mean": series(*[150 * w for w in WOBBLE]),
        "response/truncated_rate": series(*[0.05 * w for w in WOBBLE]),
        "reward/mean": series(*[0.2 + 0.03 * i * w for i, w in enumerate(WOBBLE)]),
    }
    assert d.diagnose(healthy) == []


def test_alerts_come_sorted_by_step_with_critical_first():
    alerts = d.diagnose(
        {
            "response/length_mean": series(100, 100, 100, 100, 100, 400, 400, 400),  # runaway at 6
            "policy/loss": series(1, 1, 1, 1, 1, math.nan),  # non-finite at 6
            "kl/mean": series(0, 0, 0, 2, 2, 2),  # blow-up at 4
        }
    )
    assert codes(alerts) == [
        ("kl_blowup", "kl/mean", 4),
        ("nonfinite", "policy/loss", 6),
        ("length_runaway", "response/length_mean", 6),
    ]


def test_a_new_level_rule_is_one_row_judged_like_the_others():
    spike = d.LevelRule(
        "grad_spike",
        "warning",
        "policy/grad_norm",
        limit=lambda early: 5 * early,
        past=operator.gt,
        message=lambda c: f"{c.metric} {c.value} at step {c.step}, over {c.limit} (early level {c.early})",
    )
    grad_norm = series(1, 1, 1, 1, 1, 9, 1, 9, 9, 9)  # one spike is not an alert; three points are
    alerts = d.level_alerts({"policy/grad_norm": grad_norm}, rules=[spike])
    assert [(a.code, a.step, a.value, a.message) for a in alerts] == [
        ("grad_spike", 8, 9.0, "policy/grad_norm 9 at step 8, over 5 (early level 1)")
    ]


def test_every_metric_a_rule_reads_is_listed_for_the_callers():
    assert set(d.METRICS_USED) == {
        "policy/loss",
        "critic/loss",
        "kl/mean",
        "policy/approx_kl",
        "policy/grad_norm",
        "critic/grad_norm",
        "policy/entropy",
        "response/length_mean",
        "response/truncated_rate",
        "rollout_corr/k3_kl",
        "reward/mean",
        "reward/errors",
    }


# --- the endpoint ------------------------------------------------------------------------------


def store_metrics(run, rows: list[dict]) -> None:
    """One metrics row per step from 1, as ingestion stores them (non-finite values as strings)."""
    MetricRow.objects.bulk_create(
        MetricRow(run=run, seq=step, step=step, time=float(step), values=values) for step, values in enumerate(rows, 1)
    )


@pytest.mark.django_db
@pytest.mark.usefixtures("no_dispatch", "storage")
def test_the_alerts_endpoint_lists_the_runs_alerts_by_step(api, experiment):
    run = make_run(experiment, RunState.RUNNING)
    kl = [0.0, 0.01, 0.02, 0.01, 0.02, 0.03, 0.5, 1.5, 2.0, 3.0]  # blow-up at step 8 (as above)
    store_metrics(
        run,
        [
            {"kl/mean": value, "policy/loss": "nan" if step == 9 else 0.1, "reward/mean": 0.5, "timing/step": 1.0}
            for step, value in enumerate(kl, 1)
        ],
    )
    response = api.get(f"/api/runs/{run.id}/alerts/")
    assert response.status_code == 200
    alerts = response.json()["alerts"]
    assert [(a["code"], a["severity"], a["metric"], a["step"], a["value"]) for a in alerts] == [
        ("kl_blowup", "critical", "kl/mean", 8, 1.5),
        ("nonfinite", "critical", "policy/loss", 9, None),
    ]
    assert set(alerts[0]) == {"code", "severity", "metric", "step", "message", "value", "examples_rule", "examples"}


@pytest.mark.django_db
@pytest.mark.usefixtures("no_dispatch", "storage")
def test_a_run_without_metrics_has_no_alerts_and_an_unknown_run_is_a_404(api, experiment):
    run = make_run(experiment, RunState.QUEUED)
    assert api.get(f"/api/runs/{run.id}/alerts/").json() == {"alerts": []}
    assert api.get(f"/api/runs/{unknown_run_id()}/alerts/").status_code == 404
