"""Async mode's pieces, one by one: the staleness distribution from the samples' policy versions, partial
rollout's segments (continuing a response is what one long generation draws), per-batch seeds, and the
config's field-named refusals."""

from __future__ import annotations

import pytest
import torch

from rl_engine.config import ConfigError, check_runnable, validate_config
from rl_engine.partial_rollout import generate_in_segments, mixed_seed
from rl_engine.rollout import Sample, SamplingParams, TransformersRollout
from rl_engine.staleness import staleness_metrics
from tests.unit.engine.helpers import random_policy, with_changes


def _sample(*segments: tuple[int, int]) -> Sample:
    tokens = sum(count for _, count in segments)
    return Sample(0, list(range(tokens)), "stop", segments=tuple(segments))


def test_staleness_is_the_token_weighted_lag_behind_the_trainer():
    # Trainer at version 5: 3 tokens from version 4 (lag 1), then 1 from 5 (lag 0); 4 tokens from 2 (lag 3).
    samples = [_sample((4, 3), (5, 1)), _sample((2, 4))]
    metrics = staleness_metrics(samples, trainer_version=5, max_staleness=4)
    assert metrics["staleness/mean"] == pytest.approx((3 * 1 + 1 * 0 + 4 * 3) / 8)
    assert metrics["staleness/max"] == 3.0
    shares = [metrics[f"staleness/share_{lag}"] for lag in range(5)]
    assert shares == pytest.approx([1 / 8, 3 / 8, 0.0, 4 / 8, 0.0])
    assert metrics["staleness/interrupted_fraction"] == 0.5


def test_in_flight_staleness_is_the_updates_during_generation_and_in_queue_the_updates_since_it_ended():
    # Trainer at version 5. The first sample ran from version 3 to 4 (1 update in flight) and has waited 1 since;
    # the second was generated whole under version 2 (0 in flight) and has waited 3.
    samples = [_sample((3, 2), (4, 2)), _sample((2, 4))]
    metrics = staleness_metrics(samples, trainer_version=5, max_staleness=4)
    assert metrics["staleness/in_flight_mean"] == 0.5 and metrics["staleness/in_flight_max"] == 1.0
    assert metrics["staleness/in_queue_mean"] == 2.0 and metrics["staleness/in_queue_max"] == 3.0


def test_samples_without_versions_give_no_staleness():
    assert staleness_metrics([Sample(0, [1, 2], "stop")], trainer_version=3, max_staleness=2) == {}


def test_token_versions_follow_the_segments():
    assert _sample((1, 2), (3, 1)).token_versions == [1, 1, 3]
    assert Sample(0, [1], "stop").token_versions is None


@pytest.fixture(scope="module")
def rollout(tiny_demo):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_demo / "model")
    return TransformersRollout(random_policy(tokenizer), tokenizer)


PROMPTS = [[5, 6, 7], [8, 9]]


def test_a_response_continued_in_segments_is_the_one_generated_whole(rollout):
    params = SamplingParams(n=2, max_new_tokens=9, greedy=True)
    whole = rollout.generate(PROMPTS, params)
    segmented = generate_in_segments(rollout, PROMPTS, params, segment_tokens=4, at_boundary=lambda: 0)
    assert [s.response_ids for s in segmented] == [s.response_ids for s in whole]
    assert [s.finish_reason for s in segmented] == [s.finish_reason for s in whole]
    assert [s.prompt_index for s in segmented] == [0, 0, 1, 1]


def test_each_segment_records_the_version_it_was_sampled_under(rollout):
    versions = iter([7, 8, 8, 9])
    samples = generate_in_segments(
        rollout,
        PROMPTS,
        SamplingParams(n=2, max_new_tokens=9, seed=3),
        segment_tokens=4,
        at_boundary=lambda: next(versions),
    )
    for sample in samples:
        assert sum(tokens for _, tokens in sample.segments) == len(sample.response_ids)
        assert len(sample.logprobs) == len(sample.response_ids)
        if sample.finish_reason == "length":  # 9 tokens: segments of 4, 4 and 1 under versions 7, 8, 8
            assert sample.segments == ((7, 4), (8, 5))  # no sync between the last two: one segment


def test_a_seeded_generation_repeats_and_leaves_the_process_rng_alone(rollout):
    params = SamplingParams(n=4, max_new_tokens=6, seed=mixed_seed(0, 3))
    torch.manual_seed(11)
    before = torch.get_rng_state()
    first = rollout.generate(PROMPTS, params)
    assert torch.equal(torch.get_rng_state(), before)
    second = rollout.generate(PROMPTS, params)
    other = rollout.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=6, seed=mixed_seed(0, 4)))
    assert [s.response_ids for s in first] == [s.response_ids for s in second]
    assert [s.response_ids for s in first] != [s.response_ids for s in other]


@pytest.mark.parametrize(
    ("changes", "loc", "message"),
    [
        pytest.param({"backends.max_staleness": 4}, "backends.max_staleness", "async_rollout", id="staleness-sync"),
        pytest.param(
            {"backends.partial_rollout": True}, "backends.partial_rollout", "async_rollout", id="partial-sync"
        ),
        pytest.param(
            {
                "placement.mode": "separate",
                "backends.async_rollout": True,
                "backends.rollout": "vllm",
                "backends.partial_rollout": True,
            },
            "backends.partial_rollout",
            "transformers",
            id="partial-vllm",
        ),
    ],
)
def test_async_options_outside_async_mode_are_refused_naming_the_field(changes, loc, message):
    with pytest.raises(ConfigError) as refused:
        check_runnable(validate_config(with_changes(changes)))
    assert [e["loc"] for e in refused.value.errors] == [loc]
    assert message in refused.value.errors[0]["msg"]


def test_a_staleness_beyond_the_bound_is_refused_by_the_schema():
    with pytest.raises(ConfigError) as refused:
        validate_config(with_changes({"backends.max_staleness": 0}))
    assert [e["loc"] for e in refused.value.errors] == ["backends.max_staleness"]


# --- where the policy loss's ratio is taken (algorithm.ratio_against) ---------------------------------

_ASYNC = {"placement.mode": "separate", "backends.async_rollout": True, "backends.max_staleness": 4}


@pytest.mark.parametrize(
    ("changes", "against_behaviour"),
    [
        pytest.param({}, False, id="sync-auto-proximal"),
        pytest.param(_ASYNC, True, id="async-auto-behaviour"),
        pytest.param({**_ASYNC, "algorithm.policy_loss": "decoupled_ppo"}, False, id="async-decoupled-weighs-itself"),
        pytest.param(
            {**_ASYNC, "algorithm.rollout_correction": {"method": "token_tis"}}, False, id="async-tis-weighs-itself"
        ),
        pytest.param({**_ASYNC, "algorithm.rollout_correction": {"method": "metrics"}}, True, id="async-metrics-only"),
        pytest.param({**_ASYNC, "algorithm.ratio_against": "proximal"}, False, id="async-proximal-asked"),
        pytest.param({"algorithm.ratio_against": "behaviour"}, True, id="sync-behaviour-asked"),
    ],
)
def test_auto_takes_the_ratio_against_the_behaviour_policy_in_async_mode_unless_something_weighs_by_it(
    changes, against_behaviour
):
    assert validate_config(with_changes(changes)).ratio_against_behaviour is against_behaviour


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param({"algorithm.policy_loss": "decoupled_ppo"}, "weighs by proximal / behaviour", id="decoupled"),
        pytest.param({"algorithm.rollout_correction": {"method": "token_tis"}}, "count twice", id="token-tis"),
    ],
)
def test_a_behaviour_ratio_with_a_second_importance_weight_is_refused_naming_the_field(changes, message):
    with pytest.raises(ConfigError) as refused:
        validate_config(with_changes({**_ASYNC, "algorithm.ratio_against": "behaviour", **changes}))
    assert [e["loc"] for e in refused.value.errors] == ["algorithm.ratio_against"]
    assert message in refused.value.errors[0]["msg"]


def test_the_ratio_denominator_is_the_rollout_engines_log_probs_in_async_mode_and_the_trainers_in_sync():
    from rl_engine.loop import TrainingBatch, ratio_denominator

    behaviour, proximal = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-0.5, -2.5]])
    batch = TrainingBatch(torch.tensor([0]), None, torch.tensor([1.0]), behaviour, old_logprobs=proximal)  # type: ignore[arg-type]
    assert ratio_denominator(validate_config(with_changes(_ASYNC)), batch) is behaviour
    assert ratio_denominator(validate_config(with_changes({})), batch) is proximal


def test_against_the_behaviour_policy_the_clip_stops_pushing_a_token_the_trainer_already_moved_past_it():
    """A token sampled at p = 0.2 that later updates raised to 0.3 (ratio 1.5 > 1 + 0.2): against the
    behaviour policy PPO's clip is active and its gradient is 0; against the trainer's current policy the
    ratio is 1 and it is pushed again, as if it had just been sampled. A token still inside the trust
    region is pushed either way."""
    from rl_engine.algorithms.losses import policy_loss

    current = torch.log(torch.tensor([[0.3, 0.3]])).requires_grad_(True)
    behaviour = torch.log(torch.tensor([[0.2, 0.28]]))
    advantages = torch.ones(1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)

    def gradient(old: torch.Tensor) -> torch.Tensor:
        current.grad = None
        loss, _ = policy_loss(current, old, advantages, mask, 0.2, 0.2, agg="token_mean")
        loss.backward()
        grad = current.grad
        assert grad is not None
        return grad[0]

    against_behaviour = gradient(behaviour)
    against_proximal = gradient(current.detach())
    assert against_behaviour[0] == 0.0  # ratio 1.5: clipped, no further push
    assert against_behaviour[1] == pytest.approx(-0.5 * 0.3 / 0.28)  # ratio 1.07: -A * ratio / 2 tokens
    assert against_proximal.tolist() == pytest.approx([-0.5, -0.5])  # ratio 1: both pushed as on-policy
