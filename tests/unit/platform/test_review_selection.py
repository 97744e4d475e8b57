"""Choosing what to review beyond random and per-step sampling: near the reward's decision boundary, where a
run's alerts point (the alert's step, or the examples it names), one per GRPO group. (Where the reward and a
judge disagree: tests/unit/platform/test_review_judges.py.) And rollouts_query, the one read campaigns
pick their items through."""

from __future__ import annotations

import time

import pytest

from posttrain.core.errors import InvalidInput
from posttrain.telemetry.ingestion import events_ingest
from posttrain.telemetry.selectors import rollouts_query
from tests.unit.platform.helpers import (
    make_run,
    pair_campaign,
    run_with_samples,
    sample,
    sample_record,
    samples_event,
    single_campaign,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]


@pytest.fixture
def annotators(make_user):
    return [make_user("annotator", "ann")]


def _picked(campaign) -> list[tuple[int, int]]:
    return sorted((i.rollout_a.step, i.rollout_a.index) for i in campaign.items.select_related("rollout_a"))


def test_near_boundary_picks_the_rewards_closest_to_the_boundary(experiment, annotators):
    rewards = [-1.0, -0.1, 0.2, 0.9, 3.0]
    run = run_with_samples(experiment, {1: [sample(i, r, f"q{i}", f"a{i}") for i, r in enumerate(rewards)]})
    at_zero = single_campaign([run], annotators, k=2, rule="near_boundary", source={"boundary": 0.0})
    assert _picked(at_zero) == [(1, 1), (1, 2)]  # |−0.1| and |0.2|
    assert sorted(i.selection["score"] for i in at_zero.items.all()) == [pytest.approx(0.1), pytest.approx(0.2)]
    at_default = single_campaign([run], annotators, k=1, rule="near_boundary")  # 0.5: 0.2 and 0.9 are 0.3 and 0.4 off
    assert _picked(at_default) == [(1, 2)]
    with pytest.raises(InvalidInput) as refused:
        single_campaign([run], annotators, rule="random", source={"boundary": 0.0})
    assert refused.value.errors == [{"loc": "source.boundary", "msg": "only the near_boundary rule uses boundary"}]


def test_one_per_group_picks_k_groups_and_one_response_of_each(experiment, annotators):
    samples = [sample(i, 1.0, f"q{i // 3}", f"a{i}", group=i // 3) for i in range(9)]  # three groups of three
    run = run_with_samples(experiment, {1: samples, 2: samples})
    campaign = single_campaign([run], annotators, k=2, rule="one_per_group")
    by_step: dict[int, list[int]] = {}
    for item in campaign.items.select_related("rollout_a"):
        by_step.setdefault(item.rollout_a.step, []).append(item.rollout_a.group)
        assert item.selection["group"] == item.rollout_a.group
    assert sorted(by_step) == [1, 2]
    assert all(len(groups) == 2 and len(set(groups)) == 2 for groups in by_step.values())
    again = single_campaign([run], annotators, k=2, rule="one_per_group")
    assert _picked(again) == _picked(campaign)  # the seed decides


def test_the_rules_without_a_pair_form_are_refused_for_pairs(experiment, annotators):
    run = run_with_samples(experiment, {1: [sample(0, 1.0, "q", "a")]})
    with pytest.raises(InvalidInput) as refused:
        pair_campaign([run], annotators, source={"rule": "one_per_group"})
    assert refused.value.errors == [
        {"loc": "source.rule", "msg": "one_per_group picks single responses: use a single campaign"}
    ]


# --- alerts ----------------------------------------------------------------------------------------


def run_with_an_alert(experiment):
    """A run whose kl/mean sits near 0.01 for five steps, then above 1 nat from step 6 on (a KL blow-up
    alert at step 6), with four rollouts at steps 2 and 6."""
    run = make_run(experiment, "running")
    now = time.time()
    events = [
        {"run": str(run.id), "seq": step, "type": "metrics", "step": step, "time": now, "data": {"kl/mean": kl}}
        for step, kl in enumerate([0.01, 0.012, 0.009, 0.011, 0.01, 2.0, 2.5, 3.0], start=1)
    ]
    for seq, step in ((9, 2), (10, 6)):
        samples = [sample_record(i, reward=1.0, prompt=f"s{step}q{i}", response=f"a{i}") for i in range(4)]
        events.append(samples_event(run, seq, step, samples))
    events_ingest(run.id, events)
    return run


def test_the_alerts_rule_reviews_the_step_each_alert_of_the_run_points_to(experiment, annotators):
    run = run_with_an_alert(experiment)
    campaign = single_campaign([run], annotators, k=3, rule="alerts")
    assert {step for step, _ in _picked(campaign)} == {6} and len(_picked(campaign)) == 3
    assert campaign.source["alerts"] == [{"run": str(run.id), "step": 6, "indices": None, "code": "kl_blowup"}]
    assert {tuple(i.selection["alerts"]) for i in campaign.items.all()} == {("kl_blowup",)}


def test_an_alert_that_names_its_examples_gets_exactly_those_reviewed(experiment, annotators):
    run = run_with_an_alert(experiment)
    pointer = {"run": str(run.id), "step": 2, "indices": [3, 1], "code": "reward_hacking"}
    campaign = single_campaign([run], annotators, k=1, rule="alerts", source={"alerts": [pointer]})
    assert _picked(campaign) == [(2, 1), (2, 3)]  # its examples, whatever k


def test_the_alerts_rule_refuses_steps_and_runs_without_alerts(experiment, annotators):
    quiet = run_with_samples(experiment, {1: [sample(0, 1.0, "q", "a")]})
    with pytest.raises(InvalidInput) as refused:
        single_campaign([quiet], annotators, rule="alerts")
    assert refused.value.errors == [{"loc": "source.rule", "msg": "the runs have no alerts: choose another rule"}]
    with pytest.raises(InvalidInput) as refused:
        single_campaign([quiet], annotators, rule="alerts", source={"steps": [1]})
    assert refused.value.errors == [{"loc": "source.steps", "msg": "the alerts rule takes its steps from the alerts"}]


# --- the one read --------------------------------------------------------------------------------------


def test_rollouts_query_returns_plain_dicts_with_the_texts_only_when_asked(experiment):
    run = run_with_samples(
        experiment,
        {
            1: [sample(0, 0.5, "p0", "r0", label="l0"), sample(1, None, "p1", "r1", tokens={"text": ["r", "1"]})],
            2: [sample(0, 1.0, "p2", "r2")],
        },
    )
    light = list(rollouts_query([str(run.id)], steps=[1]))
    assert light == [
        {
            "run": str(run.id),
            "step": 1,
            "index": 0,
            "group": 0,
            "reward": 0.5,
            "components": {"exact_answer": 0.5},
            "finish_reason": "stop",
        },
        {
            "run": str(run.id),
            "step": 1,
            "index": 1,
            "group": 0,
            "reward": None,
            "components": {"exact_answer": None},
            "finish_reason": "stop",
        },
    ]
    full = list(rollouts_query([str(run.id)], refs=[(str(run.id), 1, 1), (str(run.id), 2, 0)], text=True, tokens=True))
    assert [(r["step"], r["index"], r["prompt"], r["response"], r["tokens"]) for r in full] == [
        (1, 1, "p1", "r1", {"text": ["r", "1"]}),
        (2, 0, "p2", "r2", {}),
    ]
    assert [r["step"] for r in rollouts_query([str(run.id)], step_range=(2, 5))] == [2]
