"""The filters between scoring and training (`rollout.filters`): each drops exactly what it names, and
logs how many samples it dropped."""

from __future__ import annotations

import math

import pytest
import torch

from rl_engine.config import ConfigError, validate_config
from rl_engine.rollout import Sample
from rl_engine.rollout_filters import apply_filters, gibberish_flags, repetition_flags, zero_advantage_enabled

VOCAB = 100
NOISE = -math.log(VOCAB)  # a token drawn as if uniformly


def config(algorithm: dict | None = None, **filters) -> object:
    return validate_config(
        {
            "name": "filters",
            "model": {"path": "/m"},
            "data": {"path": "/d.jsonl"},
            "rewards": [{"type": "exact_match"}],
            "algorithm": algorithm or {"name": "grpo"},
            "rollout": {"prompts_per_step": 3, "samples_per_prompt": 2, "filters": filters},
            "train": {"micro_batch_size": 6},
        }
    )


def sample(group: int, ids: list[int], logprobs: list[float] | None = None) -> Sample:
    return Sample(group, ids, "stop", tuple(logprobs) if logprobs is not None else None)


def test_filters_other_than_zero_advantage_are_off_by_default_and_log_nothing():
    cfg = config(zero_advantage=False)
    samples = [sample(i // 2, [5] * 12, [NOISE] * 12) for i in range(6)]  # loops written as noise
    out = apply_filters(cfg, ["\x00\x00"] * 6, samples, torch.arange(6.0), torch.ones(6, dtype=torch.bool), VOCAB)
    assert out.keep.all() and out.metrics == {}


def test_gibberish_drops_non_text_and_noise_and_its_group_under_grpo():
    cfg = config(gibberish={"enabled": True}, zero_advantage=False)
    texts = ["12", "13", "1\x00\x00", "14", "15", "16"]  # group 1 has a response that is 2/3 not text
    samples = [sample(i // 2, [1, 2], [-0.1, -0.2]) for i in range(6)]
    samples[5] = sample(2, [1, 2], [NOISE, NOISE * 0.5])  # surprisal 0.75 of uniform's, past 0.6
    out = apply_filters(cfg, texts, samples, torch.arange(6.0), torch.ones(6, dtype=torch.bool), VOCAB)
    assert out.keep.tolist() == [True, True, False, False, False, False]
    assert out.metrics == {"filter/gibberish/dropped": 4.0}


def test_gibberish_thresholds_are_inclusive_and_need_log_probs_for_the_surprisal():
    settings = config().rollout.filters.gibberish
    flags = gibberish_flags(
        ["a" * 9 + "\x00", "a" * 11 + "\x00", "ok", "ok"],
        [None, None, None, [NOISE * 0.6]],
        VOCAB,
        settings,
    )
    assert flags == [True, False, False, True]  # 1/10 >= 0.1; 1/12 < 0.1; no log-probs; 0.6 >= 0.6


def test_repetition_drops_loops_only_its_own_row_under_a_batch_baseline():
    cfg = config({"name": "reinforce_pp"}, repetition={"enabled": True})
    loop = [7, 8] * 6  # 4-grams: 9, of which 7 repeat
    samples = [sample(i // 2, [1, 2, 3, 4, 5, 6]) for i in range(6)]
    samples[3] = sample(1, loop)
    out = apply_filters(cfg, ["x"] * 6, samples, torch.zeros(6), torch.ones(6, dtype=torch.bool), VOCAB)
    assert out.keep.tolist() == [True, True, True, False, True, True]
    assert out.metrics == {"filter/repetition/dropped": 1.0}  # zero_advantage is off for reinforce_pp


def test_repetition_rate_threshold_is_inclusive():
    settings = config(repetition={"enabled": True, "ngram": 1, "max_repetition_rate": 0.5}).rollout.filters.repetition
    # unigrams that repeat an earlier one: 1 of 4 (0.25), 3 of 6 (0.5), none
    assert repetition_flags([[1, 1, 2, 3], [1, 1, 1, 1, 2, 3], [1, 2]], settings) == [False, True, False]
    settings = config(repetition={"enabled": True, "ngram": 1, "max_repetition_rate": 0.25}).rollout.filters.repetition
    assert repetition_flags([[1, 1, 2, 3]], settings) == [True]


def test_zero_advantage_drops_tied_groups_and_counts_only_what_the_earlier_filters_left():
    cfg = config(repetition={"enabled": True})
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])  # groups 0 and 2 tied
    samples = [sample(i // 2, [1, 2, 3]) for i in range(6)]
    samples[5] = sample(2, [9] * 10)  # group 2 goes to the repetition filter first
    out = apply_filters(cfg, ["x"] * 6, samples, scores, torch.ones(6, dtype=torch.bool), VOCAB)
    assert out.keep.tolist() == [False, False, True, True, False, False]
    assert out.metrics == {"filter/repetition/dropped": 2.0, "filter/zero_advantage/dropped": 2.0}


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [
        ({"name": "grpo"}, True),
        ({"name": "dr_grpo"}, True),
        ({"name": "rloo"}, True),
        ({"name": "grpo", "kl": {"coef": 0.1}}, False),  # the KL in the loss still trains those rows
        ({"name": "grpo", "entropy_coef": 0.01}, False),
        ({"name": "reinforce_pp_baseline"}, False),  # whitened over the batch: ties are not zero
        ({"name": "ppo"}, False),
        ({"name": "reinforce_pp"}, False),
    ],
)
def test_zero_advantage_is_on_by_default_only_where_the_dropped_rows_add_no_gradient(algorithm, expected):
    assert zero_advantage_enabled(config(algorithm)) is expected


def test_zero_advantage_can_be_forced_on_or_off_and_is_refused_where_no_group_gets_zero_advantage():
    assert zero_advantage_enabled(config({"name": "grpo", "kl": {"coef": 0.1}}, zero_advantage=True))
    assert not zero_advantage_enabled(config(zero_advantage=False))
    with pytest.raises(ConfigError) as refused:
        config({"name": "ppo"}, zero_advantage=True)
    assert "rollout.filters.zero_advantage" in str(refused.value)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_the_estimators_flagged_zero_on_ties_give_a_tied_group_exactly_zero_advantage(name):
    """The catalogue's `zero_advantage_on_ties` checked against the estimator itself (responses of unequal
    length: REINFORCE++-baseline's token whitening then moves a tied group off zero)."""
    from rl_engine.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInputs
    from rl_engine.algorithms.catalogue import ESTIMATORS

    spec = ESTIMATORS[name]
    inputs = AdvantageInputs(
        scores=torch.tensor([1.0, 1.0, 0.0, 1.0]),
        mask=torch.tensor([[1.0, 1, 1], [1, 1, 1], [1, 0, 0], [1, 1, 1]]),
        group_size=2,
        normalize_std=spec.normalize_std,
    )
    advantages, _ = ADVANTAGE_ESTIMATORS.get(name)(inputs)
    assert bool((advantages[:2] == 0).all()) is spec.zero_advantage_on_ties
