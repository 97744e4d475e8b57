"""bench/learning.py's summary reads the evaluation due at each mark, not the one before it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("learning", Path(__file__).parents[3] / "bench" / "learning.py")
learning = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(learning)


def curve(*points: tuple[float, float, float]) -> list[dict]:
    return [{"due_s": due, "train_s": train, "accuracy": accuracy} for due, train, accuracy in points]


# The run the summary got wrong: evaluations land a few milliseconds after each mark.
RUN = curve(
    (0.0, 0.0, 0.14),
    (60.0, 60.36, 0.388),
    (120.0, 120.17, 0.458),
    (180.0, 180.21, 0.608),
    (240.0, 240.05, 0.732),
)


def test_the_accuracy_at_a_mark_is_the_evaluation_due_at_that_mark():
    assert learning.accuracy_at(RUN, 240.0) == 0.732  # not 0.608, the last one "at or before" 240 s
    assert learning.accuracy_at(RUN, 60.0) == 0.388
    assert learning.accuracy_at(RUN, 300.0) is None  # the run ended first


def test_the_summary_reports_every_whole_minute_and_the_end():
    summary = learning.summarize({"ours": [{"curve": RUN, "steps": 9, "peak_rss_mib": 1.0}]}, minutes=4)
    assert [summary["ours"][f"accuracy_at_{m}min"] for m in (1, 2, 3, 4)] == [0.388, 0.458, 0.608, 0.732]


def test_evaluations_are_due_at_every_interval_and_every_mark():
    assert learning.evaluation_schedule(130.0, 45.0, learning.summary_marks(130 / 60)) == [
        0.0,
        45.0,
        60.0,
        90.0,
        120.0,
        130.0,
    ]


def test_one_evaluation_serves_every_due_time_a_long_step_passed():
    evaluations = learning.Evaluations(budget_s=60.0, every_s=30.0, minutes=1.0)
    assert evaluations.reached(0.0) == [0.0]
    assert evaluations.reached(20.0) == []
    assert evaluations.reached(61.0) == [30.0, 60.0]
    assert evaluations.done


def test_time_to_a_target_and_from_when_it_held():
    run = curve((0, 0, 0.5), (60, 60.2, 0.91), (120, 120.1, 0.89), (180, 180.3, 0.92), (240, 240.2, 0.95))
    assert learning.time_to(run, 0.9) == 60.2
    assert learning.held_from(run, 0.9) == 180  # the dip at 120 s restarts it
    assert learning.held_from(run, 0.99) is None


@pytest.mark.parametrize("loss", ["ppo_clip", "gspo"])
def test_search_candidates_are_valid_run_configs(loss, tmp_path):
    from rl_engine.config import validate_config
    from rl_engine.demo.run_config import demo_run_config

    for overrides in learning.search_candidates([loss], [2e-4], [16, 32]).values():
        cfg = validate_config(demo_run_config(tmp_path, **overrides).model_dump(mode="json"))
        assert cfg.algorithm.policy_loss == loss and cfg.train.lr == 2e-4


def test_a_step_budget_evaluates_by_steps_and_at_the_last():
    evaluations = learning.Evaluations(0.0, 5, 0.0, steps=12)
    assert evaluations.reached(clock=999.0, step=0) == [0.0]  # the clock does not count
    assert evaluations.reached(clock=0.0, step=4) == []
    assert evaluations.reached(clock=0.0, step=10) == [5.0, 10.0]
    assert evaluations.reached(clock=0.0, step=12) == [12.0] and evaluations.done


def test_at_equal_samples_each_system_reports_its_median_accuracy_and_training_time():
    def run(*points: tuple[int, float, float]) -> dict:
        curve = [{"samples": n, "train_s": t, "accuracy": a, "due_s": n} for n, t, a in points]
        return {"curve": curve, "peak_rss_mib": 1.0}

    results = {
        "async4_tis": [run((0, 0.0, 0.1), (256, 10.0, 0.5)), run((0, 0.0, 0.1), (256, 14.0, 0.7))],
        "default": [run((0, 0.0, 0.1), (256, 20.0, 0.6)), run((0, 0.0, 0.1))],  # a seed that ended early
    }
    summary = learning.summarize_by_samples(results)
    assert summary["async4_tis"]["accuracy_at_256_samples"] == 0.6
    assert summary["async4_tis"]["train_s_at_256_samples"] == 12.0
    assert "accuracy_at_256_samples" not in summary["default"]  # not every seed got there
