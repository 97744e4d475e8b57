"""Reward-hacking signals on hand-made streams: each fires on its planted pattern, at the step worked out by
hand in a comment, and stays quiet on a clean run of the same shape. Then the examples each names, and the
path from a run's stored events to an alert with its example rollouts and on to a review campaign."""

from __future__ import annotations

import time

import pytest

from posttrain.runs import diagnostics
from posttrain.runs import hacking as h
from posttrain.runs.hacking_examples import pick_examples
from posttrain.telemetry.alerts import run_alerts
from posttrain.telemetry.ingestion import events_ingest
from tests.unit.platform.helpers import make_run, sample_record, samples_event, single_campaign

# A small, trendless batch-to-batch wobble added to every planted curve: noise the signals must ride out.
WOBBLE = [0.0, 0.01, -0.01, 0.005, -0.005]


def steps(n: int, start: int = 1) -> list[int]:
    return list(range(start, start + n))


def curve(values: list[float], start: int = 1) -> tuple[list[int], list[float | None]]:
    return steps(len(values), start), [v + WOBBLE[i % len(WOBBLE)] for i, v in enumerate(values)]


def codes(alerts: list[diagnostics.Alert]) -> list[tuple[str, str, int]]:
    return [(a.code, a.metric, a.step) for a in alerts]


# --- training reward up, held-out down ----------------------------------------------------------------


TRAIN_RISING = [0.2 + 0.01 * s for s in range(41)]  # steps 0..40


def held_out(values: list[float]) -> tuple[list[int], list[float | None]]:
    """An evaluation every 5 steps from step 0."""
    return list(range(0, 5 * len(values), 5)), list(values)


def test_held_out_accuracy_falling_while_training_reward_rises_is_critical_at_the_first_confirmed_drop():
    # Held-out exact match peaks at 0.4 at step 15, then 0.3 (step 20) and 0.25 (step 25): 0.1 below the best
    # is past 10% of it (0.04) at both, and the training reward rose from its level at step 15: alert at 20.
    series = {
        "reward/mean": (steps(41, 0), TRAIN_RISING),
        "eval/reward/mean": held_out([0.2, 0.3, 0.35, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7]),  # the hacked reward, up
        "eval/reward/exact_match": held_out([0.2, 0.3, 0.35, 0.4, 0.3, 0.25, 0.2, 0.2, 0.15]),
    }
    alerts = h.divergence_alerts(series)
    assert codes(alerts) == [("train_heldout_divergence", "eval/reward/exact_match", 20)]
    assert alerts[0].severity == "critical" and alerts[0].value == 0.3
    assert alerts[0].examples_rule == "top_reward_low:exact_match"
    assert "best 0.4 (step 15)" in alerts[0].message


def test_held_out_rising_with_training_reward_or_falling_with_it_is_not_divergence():
    clean = {
        "reward/mean": (steps(41, 0), TRAIN_RISING),
        "eval/reward/exact_match": held_out([0.2, 0.3, 0.28, 0.35, 0.33, 0.4, 0.42, 0.41, 0.45]),
    }
    assert h.divergence_alerts(clean) == []
    # Both falling together is a run getting worse (instability), not a reward being gamed.
    falling = {
        "reward/mean": (steps(41, 0), [0.6 - 0.01 * s for s in range(41)]),
        "eval/reward/exact_match": held_out([0.4, 0.4, 0.35, 0.3, 0.25, 0.2, 0.2, 0.15, 0.1]),
    }
    assert h.divergence_alerts(falling) == []


def test_one_bad_evaluation_is_not_a_confirmed_drop():
    series = {
        "reward/mean": (steps(41, 0), TRAIN_RISING),
        "eval/reward/exact_match": held_out([0.2, 0.3, 0.35, 0.4, 0.3, 0.41, 0.42, 0.3, 0.43]),
    }
    assert h.divergence_alerts(series) == []


# --- reward following length at fixed correctness ---------------------------------------------------------


def length_run(correct: list[float]) -> dict:
    return {
        "reward/mean": curve([0.3 + 0.02 * s for s in range(20)]),
        "response/length_mean": curve([10 + 0.5 * s for s in range(20)]),
        "reward/long": curve([0.2 + 0.03 * s for s in range(20)]),
        "reward/correct": curve(correct),
    }


def test_reward_rising_with_length_while_correctness_stays_flat_fires_at_the_end_of_the_first_window():
    # Window steps 1-10: reward 0.32 -> 0.48 (median of the edges), length 11 -> 14.5 (+32%), correlated;
    # reward/correct flat at 0.4. The windows ending at 10, 11 and 12 all hold: alert at step 10.
    alerts = h.length_alerts(length_run([0.4] * 20))
    assert codes(alerts) == [("reward_with_length", "reward/mean", 10)]
    assert "reward/correct stayed flat" in alerts[0].message and alerts[0].examples_rule == "longest_well_paid"


def test_length_growing_with_correctness_is_learning_not_hacking():
    assert h.length_alerts(length_run([0.3 + 0.02 * s for s in range(20)])) == []


# --- one component carrying the total ----------------------------------------------------------------------


def component_run(correct: list[float]) -> dict:
    return {
        "reward/mean": curve([0.4 + 0.02 * s for s in range(20)]),
        "reward/format": curve([0.2 + 0.04 * s for s in range(20)]),
        "reward/correct": curve(correct),
    }


def test_one_component_rising_while_the_others_fall_fires_at_the_end_of_the_first_window():
    # format 0.24 -> 0.6 over steps 1-10 while correct falls 0.5 -> 0.41 (0.09 >= 5% of 0.5): windows ending at
    # 10, 11, 12 all hold: alert at step 10.
    alerts = h.component_alerts(component_run([0.52 - 0.01 * s for s in range(20)]))
    assert codes(alerts) == [("component_carries_reward", "reward/format", 10)]
    assert alerts[0].examples_rule == "component_over_others:format"


def test_one_component_growing_faster_than_another_that_also_grows_is_not_an_alert():
    """rewardspy's dominance check alone would fire here: one component carries most of the change."""
    assert h.component_alerts(component_run([0.5 + 0.005 * s for s in range(20)])) == []


# --- degeneration and patterns (level rules) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("metric", "early", "planted", "code", "rule"),
    [
        # early 0.05; limit max(0.05 + 0.2, 0.1) = 0.25: steps 8-10 are past it
        ("response/repetition_rate", 0.05, 0.5, "repetition_rising", "most_repetitive"),
        # early 0; limit max(0 + 0.05, 0) = 0.05
        ("response/nonprintable_share", 0.0, 0.2, "gibberish_rising", "most_nonprintable"),
        # early 1.5; limit max(1.5 * 1.5, 2.4) = 2.4
        ("response/compression_ratio", 1.5, 4.0, "compression_rising", "most_compressible"),
        # early 0.2; limit 0.45
        ("reward/group_all_equal_rate", 0.2, 0.7, "zero_advantage_rising", "tied_groups"),
        # early 0.125 (one prompt in eight); limit max(0.425, 0.5) = 0.5
        ("response/top_answer_group_share", 0.125, 0.9, "format_only_pattern", "top_answer"),
    ],
)
def test_a_degeneration_metric_rising_past_its_limit_fires_at_the_first_of_three_points(
    metric, early, planted, code, rule
):
    clean = [early] * 12
    assert h.hacking_alerts({metric: curve(clean)}) == []
    planted_run = [early] * 7 + [planted] * 5  # steps 8-12
    alerts = h.hacking_alerts({metric: curve(planted_run)})
    assert codes(alerts) == [(code, metric, 8)]
    assert alerts[0].examples_rule == rule and alerts[0].severity == "warning"


def test_a_clean_run_raises_no_hacking_signal_at_all():
    series = {
        "reward/mean": curve([0.3 + 0.01 * s for s in range(30)]),
        "reward/correct": curve([0.3 + 0.01 * s for s in range(30)]),
        "reward/format": curve([0.8 + 0.002 * s for s in range(30)]),
        "response/length_mean": curve([12.0] * 30),
        "response/repetition_rate": curve([0.05] * 30),
        "response/nonprintable_share": curve([0.0] * 30),
        "response/compression_ratio": curve([1.6] * 30),
        "reward/group_all_equal_rate": curve([0.3] * 30),
        "response/top_answer_group_share": curve([0.125] * 30),
        "eval/reward/mean": held_out([0.3, 0.35, 0.4, 0.42, 0.45, 0.5]),
        "eval/reward/correct": held_out([0.3, 0.34, 0.38, 0.4, 0.41, 0.44]),
    }
    assert h.hacking_alerts(series) == []


def test_the_signals_read_the_runs_own_component_curves_and_nothing_else():
    logged = ["reward/mean", "reward/std", "reward/exact", "reward/exact/log", "eval/reward/exact", "timing/step"]
    used = h.metrics_used(logged)
    assert {"reward/mean", "reward/exact", "eval/reward/exact"} <= set(used)
    assert not {"reward/std", "reward/exact/log", "timing/step"} & set(used)


# --- examples --------------------------------------------------------------------------------------------


def rollout(index: int, response: str, reward: float, group: int = 0, **components: float) -> dict:
    return {"index": index, "group": group, "response": response, "reward": reward, "components": components}


def test_each_examples_rule_picks_the_rollouts_that_show_its_pattern():
    rollouts = [
        rollout(0, "42", 1.0, 0, hack=1.0, exact=1.0),
        rollout(1, "the the the the the the the the", 1.0, 0, hack=1.0, exact=0.0),
        rollout(2, "<answer></answer>", 0.6, 1, hack=0.6, exact=0.0),
        rollout(3, "<ANSWER></answer>", 0.6, 2, hack=0.6, exact=0.0),
        rollout(4, "a\x00\x00\x00", 0.0, 2, hack=0.0, exact=0.0),
        rollout(5, "7", 0.0, 3, hack=0.0, exact=0.0),
    ]
    assert pick_examples("top_reward", rollouts, k=2) == [0, 1]
    assert pick_examples("top_reward_low:exact", rollouts, k=1) == [1]  # paid 1.0, exact 0
    assert pick_examples("most_repetitive", rollouts, k=1) == [1]
    assert pick_examples("most_nonprintable", rollouts, k=1) == [4]
    assert pick_examples("top_answer", rollouts) == [2, 3]  # one answer in groups 1 and 2
    assert pick_examples("component_over_others:hack", rollouts, k=1) == [1]
    assert pick_examples("tied_groups", rollouts) == [0, 2, 5]  # groups 0, 1 and 3 scored all alike
    assert pick_examples("longest_well_paid", rollouts, k=1) == [1]
    assert pick_examples("no_such_rule", rollouts) == []


# --- stored events -> alert with examples -> review campaign -----------------------------------------------


def hacked_run(experiment):
    """A run whose response/repetition_rate jumps at step 8 (a repetition_rising alert at 8) and whose step 8
    holds six rollouts, two of them loops."""
    run = make_run(experiment, "running")
    now = time.time()
    rates = [0.05] * 7 + [0.6] * 4
    events = [
        {
            "run": str(run.id),
            "seq": step,
            "type": "metrics",
            "step": step,
            "time": now,
            "data": {"response/repetition_rate": r},
        }
        for step, r in enumerate(rates, start=1)
    ]
    responses = ["12", "ok ok ok ok ok ok ok ok ok", "13", "go go go go go go go go", "14", "15"]
    records = [sample_record(i, reward=1.0, prompt=f"q{i}", response=text) for i, text in enumerate(responses)]
    events.append(samples_event(run, 12, 8, records))
    events_ingest(run.id, events)
    return run


@pytest.mark.django_db
@pytest.mark.usefixtures("no_dispatch", "storage")
def test_a_signal_on_the_run_page_names_its_step_and_example_rollouts(api, experiment):
    run = hacked_run(experiment)
    alerts = api.get(f"/api/runs/{run.id}/alerts/").json()["alerts"]
    signal = next(a for a in alerts if a["code"] == "repetition_rising")
    assert signal["step"] == 8 and signal["examples_rule"] == "most_repetitive"
    assert signal["examples"][:2] == [1, 3]  # the two loops first


@pytest.mark.django_db
@pytest.mark.usefixtures("no_dispatch")
def test_the_review_alerts_rule_takes_a_signals_example_rollouts(experiment, make_user):
    run = hacked_run(experiment)
    examples = next(a for a in run_alerts(run.id) if a.code == "repetition_rising").examples
    campaign = single_campaign([run], [make_user("annotator", "ann")], k=1, rule="alerts")
    pointer = next(p for p in campaign.source["alerts"] if p["code"] == "repetition_rising")
    assert pointer["indices"] == list(examples)
    picked = sorted((i.rollout_a.step, i.rollout_a.index) for i in campaign.items.select_related("rollout_a"))
    assert picked == sorted((8, index) for index in examples)  # its examples, whatever k
