"""Campaign sampling runs in DuckDB with a limit (posttrain.review.candidates): at most about k candidates per step
reach Python, seeded (the same seed picks the same items), and the score rules pick exactly what scoring every
rollout in Python picks. A campaign over more rollouts than settings.REVIEW_CAMPAIGN_INLINE_MAX_ROLLOUTS is
built on a worker: building until then, a draft with its items after, or failed with the reason."""

from __future__ import annotations

import math
import random

import pytest

from posttrain.review import services as review
from posttrain.review.candidates import PAIR_SAMPLE_SLACK, candidate_batches
from posttrain.review.models import CampaignState
from posttrain.review.sampling import Candidate, select, validate_source
from posttrain.review.services import campaigns as review_campaigns
from posttrain.telemetry.selectors import rollouts_query
from tests.unit.platform.helpers import PASS_FAIL, a_campaign_owner, default_project, run_with_samples, sample

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]


@pytest.fixture
def annotators(make_user):
    return [make_user("annotator", "ann")]


def noisy_step(step: int, count: int = 40) -> list[dict]:
    """Rollouts with ties, missing and non-finite rewards, and components missing or not numbers."""
    rng = random.Random(step)
    rows = []
    for i in range(count):
        reward = rng.choice([None, math.nan, round(rng.uniform(-1, 1), 1), 0.5])
        components = {"exact": rng.choice([0.0, 1.0, None]), "format": rng.choice([0.0, 0.5, 1.0])}
        if i % 7 == 0:
            components.pop("format")
        rows.append(sample(i, reward, f"p{i % 5}", f"r{i % 9}", group=i // 4, components=components))
    return rows


def python_picks(source: dict, kind: str) -> list:
    """What selection picked when every rollout came into Python (the reference the query must match)."""
    candidates = [Candidate.from_rollout(r) for r in rollouts_query(source["runs"], text=kind == "pair")]
    return [(p.a, p.b) for p in select(candidates, source, kind)]


def duckdb_picks(source: dict, kind: str) -> list:
    return [(p.a, p.b) for batch in candidate_batches(source, kind, {}, []) for p in select(batch, source, kind)]


@pytest.mark.parametrize(
    "rule, extra",
    [
        ("lowest_reward", {}),
        ("highest_reward", {}),
        ("near_boundary", {"boundary": 0.2}),
        ("component_disagreement", {"components": ["exact", "format"]}),
        ("reward_vs_component", {"components": ["exact"]}),
    ],
)
def test_the_score_rules_pick_in_duckdb_what_scoring_every_rollout_picks(experiment, rule, extra):
    run = run_with_samples(experiment, {step: noisy_step(step) for step in (1, 2, 3)})
    source = validate_source({"runs": [str(run.id)], "rule": rule, "k": 5, **extra}, "single")
    picked = duckdb_picks(source, "single")
    assert picked and picked == python_picks(source, "single")


@pytest.mark.parametrize("rule", ["lowest_reward", "highest_reward"])
def test_pairs_within_a_run_pick_in_duckdb_what_scoring_every_rollout_picks(experiment, rule):
    run = run_with_samples(experiment, {step: noisy_step(step) for step in (1, 2)})
    source = validate_source({"runs": [str(run.id)], "rule": rule, "k": 3}, "pair")
    picked = duckdb_picks(source, "pair")
    assert picked and [(a, b) for a, b in picked] == [
        (a, b) for a, b in python_picks(source, "pair")
    ]  # the digests of the texts pair the same responses as the texts


def test_at_most_k_candidates_per_step_reach_python_and_the_seed_decides_which(experiment):
    run = run_with_samples(experiment, {step: noisy_step(step, count=60) for step in (1, 2, 3)})

    def drawn(seed: int) -> list[tuple]:
        source = validate_source({"runs": [str(run.id)], "rule": "random", "k": 4, "seed": seed}, "single")
        batches = list(candidate_batches(source, "single", {}, []))
        return [c.key for batch in batches for c in batch]

    keys = drawn(7)
    assert len(keys) == 12 and {sum(1 for k in keys if k[1] == step) for step in (1, 2, 3)} == {4}
    assert drawn(7) == keys
    assert {tuple(drawn(seed)) for seed in range(4)} != {tuple(keys)}


def test_a_large_prompt_group_sends_a_bounded_number_of_responses_for_pairs(experiment):
    run = run_with_samples(experiment, {1: [sample(i, 0.5, "q", f"answer {i}", group=0) for i in range(200)]})
    source = validate_source({"runs": [str(run.id)], "rule": "random", "k": 2, "seed": 3}, "pair")
    (batch,) = candidate_batches(source, "pair", {}, [])
    assert len(batch) == 2 * 2 + PAIR_SAMPLE_SLACK
    assert len(select(batch, source, "pair")) == 2


def campaign(runs, annotators, **source):
    return review.campaign_create(
        name="big",
        kind="single",
        questions=PASS_FAIL,
        source={"runs": [str(r.id) for r in runs], "rule": "random", "k": 3, "seed": 5, **source},
        annotators=annotators,
        project=default_project(),
        user=a_campaign_owner(),
    )


def picked(c) -> set[tuple[int, int]]:
    return {(i.rollout_a.step, i.rollout_a.index) for i in c.items.select_related("rollout_a")}


def test_a_campaign_over_more_rollouts_than_the_request_reads_is_built_on_a_worker(
    experiment, annotators, settings, monkeypatch, django_capture_on_commit_callbacks
):
    run = run_with_samples(experiment, {step: noisy_step(step, count=10) for step in (1, 2)})
    inline = campaign([run], annotators)
    sent: list[tuple[str, ...]] = []
    # task_send is looked up in the module that queues the build
    monkeypatch.setattr(review_campaigns, "task_send", lambda name, *args: sent.append((name, *args)))
    settings.REVIEW_CAMPAIGN_INLINE_MAX_ROLLOUTS = 19  # the source holds 20

    with django_capture_on_commit_callbacks(execute=True):
        queued = campaign([run], annotators)
    assert (queued.state, queued.items.count()) == (CampaignState.BUILDING, 0)
    assert sent == [("review_campaign_build", str(queued.pk))]
    review.campaign_build(queued.pk)
    queued.refresh_from_db()
    assert queued.state == CampaignState.DRAFT
    assert picked(queued) == picked(inline) and len(picked(queued)) == 6  # the same seed, the same items
    review.campaign_build(queued.pk)  # delivered twice: nothing more happens
    assert queued.items.count() == 6


def test_a_campaign_a_worker_cannot_build_fails_with_the_reason(experiment, annotators, settings):
    run = run_with_samples(experiment, {1: noisy_step(1, count=4)})
    settings.REVIEW_CAMPAIGN_INLINE_MAX_ROLLOUTS = -1
    queued = campaign([run], annotators, steps=[9])
    review.campaign_build(queued.pk)
    queued.refresh_from_db()
    assert queued.state == CampaignState.FAILED
    assert queued.build_error.startswith("source: selects no items")
    assert review.campaign_close(queued).state == CampaignState.CLOSED
