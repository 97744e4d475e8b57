"""Advantage estimators against small hand-computed values."""

import math

import pytest
import torch
from torch.testing import assert_close

from rl_engine.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    discounted_returns,
    dr_grpo_advantages,
    gae,
    grpo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from rl_engine.algorithms.catalogue import ESTIMATORS

NAN = float("nan")

# Two groups of size 3; lengths 2, 1, 3 | 3, 2, 1 (right-padded to 3).
GROUPED_MASK = torch.tensor(
    [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 0]],
    dtype=torch.float32,
)


def per_token(values: list[float], mask: torch.Tensor = GROUPED_MASK) -> torch.Tensor:
    """Hand-written per-sequence values spread over each row's real tokens."""
    return torch.tensor(values).unsqueeze(-1) * mask


# --- GAE -----------------------------------------------------------------------------------------


def test_gae_matches_hand_computed_recursion():
    # Row 0 (3 tokens), gamma 0.9, lam 0.8:
    #   deltas: t2 = 1 - 0.7 = 0.3, t1 = 0.9*0.7 - 0.6 = 0.03, t0 = 0.9*0.6 - 0.5 = 0.04
    #   A2 = 0.3, A1 = 0.03 + 0.72*0.3 = 0.246, A0 = 0.04 + 0.72*0.246 = 0.21712
    # Row 1 (2 tokens): delta1 = 2 - 0.5 = 1.5, delta0 = 0.9*0.5 - 1 = -0.55
    #   A1 = 1.5, A0 = -0.55 + 0.72*1.5 = 0.53
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [1.0, 0.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])

    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)

    assert_close(advantages, torch.tensor([[0.21712, 0.246, 0.3], [0.53, 1.5, 0.0]]))
    assert_close(returns, torch.tensor([[0.71712, 0.846, 1.0], [1.53, 2.0, 0.0]]))


def test_gae_with_gamma_and_lambda_one_is_monte_carlo_return_minus_value():
    rewards = torch.tensor([[0.1, -0.2, 1.0]])
    values = torch.tensor([[0.3, 0.4, 0.5]])
    advantages, returns = gae(rewards, values, torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert_close(returns, torch.tensor([[0.9, 0.8, 1.0]]))
    assert_close(advantages, torch.tensor([[0.6, 0.4, 0.5]]))


def test_gae_with_lambda_zero_is_one_step_td_error():
    rewards = torch.tensor([[0.0, 1.0]])
    values = torch.tensor([[0.2, 0.5]])
    advantages, _ = gae(rewards, values, torch.ones(1, 2), gamma=0.5, lam=0.0)
    assert_close(advantages, torch.tensor([[0.5 * 0.5 - 0.2, 1.0 - 0.5]]))


def test_gae_ignores_whatever_sits_in_padding():
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    rewards = torch.tensor([[0.0, 1.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]])
    values = torch.tensor([[0.3, 0.4, 0.0, 0.0], [0.1, 0.0, 0.0, 0.0]])
    garbage_rewards = torch.where(mask.bool(), rewards, torch.tensor(NAN))
    garbage_values = torch.where(mask.bool(), values, torch.tensor(1e6))

    clean = gae(rewards, values, mask, gamma=0.99, lam=0.95)
    dirty = gae(garbage_rewards, garbage_values, mask, gamma=0.99, lam=0.95)

    assert_close(dirty, clean)
    assert torch.all(clean[0][~mask.bool()] == 0) and torch.all(clean[1][~mask.bool()] == 0)


def test_gae_treats_the_value_after_the_last_token_as_zero():
    # A one-token response: A = r - V regardless of gamma (no bootstrap from padding).
    advantages, _ = gae(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.25, 99.0]]), torch.tensor([[1, 0]]), 0.9, 0.9)
    assert_close(advantages, torch.tensor([[0.75, 0.0]]))


def test_gae_outputs_are_detached():
    values = torch.tensor([[0.5, 0.5]], requires_grad=True)
    advantages, returns = gae(torch.tensor([[0.0, 1.0]]), values, torch.ones(1, 2))
    assert not advantages.requires_grad and not returns.requires_grad


# --- GRPO / Dr. GRPO -----------------------------------------------------------------------------


def test_grpo_normalises_by_the_unbiased_group_std():
    # Group [1, 0, 0]: mean 1/3, unbiased var ((2/3)^2 + 2*(1/3)^2) / 2 = 1/3, std = 1/sqrt(3)
    #   -> advantages 2/sqrt(3), -1/sqrt(3), -1/sqrt(3).  Group [2, 2, 2] -> all 0.
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 2.0])
    expected = per_token([2 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), 0.0, 0.0, 0.0])
    assert_close(grpo_advantages(rewards, GROUPED_MASK, group_size=3), expected)


def test_grpo_pairs_of_one_and_zero_give_plus_minus_one_over_root_two():
    # Rewards [1, 0, 0, 1], group size 2: mean 0.5, unbiased std sqrt(0.5) -> +-0.5/sqrt(0.5) = +-1/sqrt(2).
    mask = torch.ones(4, 2)
    advantages = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), mask, group_size=2)
    root_half = 1 / math.sqrt(2)
    assert_close(advantages, per_token([root_half, -root_half, -root_half, root_half], mask))


def test_grpo_eps_is_added_to_the_std():
    advantages = grpo_advantages(torch.tensor([1.0, 0.0]), torch.ones(2, 1), group_size=2, eps=0.5)
    std = math.sqrt(0.5)
    assert_close(advantages, torch.tensor([[0.5 / (std + 0.5)], [-0.5 / (std + 0.5)]]))


def test_grpo_without_std_normalisation_equals_dr_grpo():
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 2.0])
    assert_close(
        grpo_advantages(rewards, GROUPED_MASK, 3, normalize_std=False), dr_grpo_advantages(rewards, GROUPED_MASK, 3)
    )


def test_dr_grpo_only_subtracts_the_group_mean():
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 5.0])
    expected = per_token([2 / 3, -1 / 3, -1 / 3, -1.0, -1.0, 2.0])
    assert_close(dr_grpo_advantages(rewards, GROUPED_MASK, group_size=3), expected)


def test_grpo_with_group_size_one_gives_zero_advantages():
    assert_close(grpo_advantages(torch.tensor([3.0, -1.0]), torch.ones(2, 2), group_size=1), torch.zeros(2, 2))


# --- RLOO ----------------------------------------------------------------------------------------


def test_rloo_baseline_excludes_the_sample_itself():
    # Group [1, 0, 0]: A0 = 1 - mean(0, 0) = 1, A1 = 0 - mean(1, 0) = -0.5, A2 = -0.5.
    # (A mean that included the sample would give 2/3 for A0.)  Group [2, 2, 5]: 2 - 3.5, 2 - 3.5, 5 - 2.
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 5.0])
    expected = per_token([1.0, -0.5, -0.5, -1.5, -1.5, 3.0])
    assert_close(rloo_advantages(rewards, GROUPED_MASK, group_size=3), expected)


def test_rloo_with_group_size_two_is_the_reward_difference():
    mask = torch.ones(4, 1)
    assert_close(
        rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), mask, group_size=2),
        torch.tensor([[1.0], [-1.0], [-1.0], [1.0]]),
    )


def test_rloo_refuses_a_group_of_one():
    with pytest.raises(ValueError, match="group_size >= 2"):
        rloo_advantages(torch.tensor([1.0, 0.0]), torch.ones(2, 1), group_size=1)


# --- REINFORCE++ ---------------------------------------------------------------------------------


def test_discounted_returns_sum_future_rewards_within_each_row():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert_close(discounted_returns(rewards, mask, gamma=0.5), torch.tensor([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]))


def test_reinforce_pp_whitens_discounted_returns_over_all_tokens_of_the_batch():
    # gamma 0.5 returns: [0.25, 0.5, 1] and [1, 2, pad] -> 5 tokens, mean 0.95,
    # deviations -0.7, -0.45, 0.05, 0.05, 1.05, population var 1.8 / 5 = 0.36, std 0.6.
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    expected = torch.tensor([[-0.7 / 0.6, -0.45 / 0.6, 0.05 / 0.6], [0.05 / 0.6, 1.05 / 0.6, 0.0]])
    assert_close(reinforce_pp_advantages(rewards, mask, gamma=0.5), expected)


def test_reinforce_pp_puts_a_per_sequence_score_on_the_last_token():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    scores = torch.tensor([1.0, 2.0])
    token_rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    assert_close(
        reinforce_pp_advantages(scores, mask, gamma=0.5), reinforce_pp_advantages(token_rewards, mask, gamma=0.5)
    )


def test_reinforce_pp_ignores_whatever_sits_in_padding():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    rewards = torch.tensor([[0.3, 1.0, 0.0], [2.0, 0.0, 0.0]])
    dirty = torch.where(mask.bool(), rewards, torch.tensor(NAN))
    assert_close(reinforce_pp_advantages(dirty, mask, gamma=0.9), reinforce_pp_advantages(rewards, mask, gamma=0.9))


def test_reinforce_pp_baseline_subtracts_group_mean_then_whitens_over_tokens():
    # Rewards [1, 0, 0, 1], group size 2 -> centred [0.5, -0.5, -0.5, 0.5]; lengths 2, 1, 1, 2 give six
    # tokens: four of 0.5 and two of -0.5. Token mean 1/6; deviations 1/3 and -2/3; population var 2/9,
    # std sqrt(2)/3 -> whitened 1/sqrt(2) and -sqrt(2).
    mask = torch.tensor([[1, 1], [1, 0], [1, 0], [1, 1]])
    advantages = reinforce_pp_baseline_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), mask, group_size=2)
    high, low = 1 / math.sqrt(2), -math.sqrt(2)
    assert_close(advantages, torch.tensor([[high, high], [low, 0.0], [low, 0.0], [high, high]]))


# --- by name -------------------------------------------------------------------------------------

GROUP_NAMES = sorted(name for name, spec in ESTIMATORS.items() if spec.level == "group")


def by_name(name: str, rewards: torch.Tensor, mask: torch.Tensor, group: int, **inputs) -> torch.Tensor:
    """The registered estimator `name`, with its own std default unless `normalize_std` is given."""
    inputs.setdefault("normalize_std", ESTIMATORS[name].normalize_std)
    return ADVANTAGE_ESTIMATORS.get(name)(AdvantageInputs(rewards, mask, group, **inputs))[0]


def test_every_catalogued_estimator_is_registered_and_nothing_else():
    assert set(ADVANTAGE_ESTIMATORS.names()) == set(ESTIMATORS)


def test_an_unknown_estimator_name_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="unknown advantage estimator 'sarsa'; expected one of: .*grpo"):
        ADVANTAGE_ESTIMATORS.get("sarsa")


def test_a_name_outside_the_catalogue_cannot_be_registered():
    with pytest.raises(ValueError, match="not in the catalogue"):
        ADVANTAGE_ESTIMATORS.register("sarsa")


@pytest.mark.parametrize("name", GROUP_NAMES)
def test_group_estimators_return_token_advantages_that_are_zero_on_padding(name):
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.9, 0.9])
    advantages = by_name(name, rewards, GROUPED_MASK, 3)
    assert advantages.shape == GROUPED_MASK.shape
    assert torch.all(advantages[GROUPED_MASK == 0] == 0)
    assert torch.isfinite(advantages).all()


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_per_group_estimators_give_every_token_of_a_row_the_same_value(name):
    advantages = by_name(name, torch.tensor([1.0, 0.0, 0.5, 0.2, 0.9, 0.3]), GROUPED_MASK, 3)
    full_row = advantages[2]
    assert_close(full_row, full_row[0].expand(3))


@pytest.mark.parametrize("name", GROUP_NAMES)
def test_group_estimators_accept_a_bool_mask(name):
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.9, 0.9])
    assert_close(by_name(name, rewards, GROUPED_MASK.bool(), 3), by_name(name, rewards, GROUPED_MASK, 3))


@pytest.mark.parametrize("name", GROUP_NAMES)
def test_group_estimators_refuse_a_batch_that_is_not_whole_groups(name):
    with pytest.raises(ValueError, match="multiple of group_size"):
        by_name(name, torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0]), torch.ones(5, 2), 2)


@pytest.mark.parametrize("name", GROUP_NAMES)
def test_group_estimators_give_zero_when_every_sample_of_every_group_scores_the_same(name):
    advantages = by_name(name, torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.ones(4, 2), 2)
    assert_close(advantages, torch.zeros(4, 2))


# --- normalize_advantage_std: every estimator honours it --------------------------------------------


def test_rloo_with_std_normalisation_divides_by_the_group_std():
    # Group [1, 0, 0.5]: leave-one-out advantages 1 - 0.25, 0 - 0.75, 0.5 - 0.5; unbiased std 0.5.
    rewards = torch.tensor([1.0, 0.0, 0.5])
    mask = torch.ones(3, 1)
    assert_close(rloo_advantages(rewards, mask, 3, normalize_std=True, eps=0.0), torch.tensor([[1.5], [-1.5], [0.0]]))


def test_reinforce_pp_without_std_normalisation_only_subtracts_the_token_mean():
    # gamma 0.5 returns [0.25, 0.5, 1] and [1, 2, pad]: token mean 0.95.
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    expected = torch.tensor([[-0.7, -0.45, 0.05], [0.05, 1.05, 0.0]])
    assert_close(reinforce_pp_advantages(rewards, mask, gamma=0.5, normalize_std=False), expected)


def test_reinforce_pp_baseline_without_std_normalisation_is_group_centred_then_token_centred():
    # Centred [0.5, -0.5, -0.5, 0.5] over lengths 2, 1, 1, 2: token mean 1/6.
    mask = torch.tensor([[1, 1], [1, 0], [1, 0], [1, 1]])
    advantages = reinforce_pp_baseline_advantages(
        torch.tensor([1.0, 0.0, 0.0, 1.0]), mask, group_size=2, normalize_std=False
    )
    high, low = 0.5 - 1 / 6, -0.5 - 1 / 6
    assert_close(advantages, torch.tensor([[high, high], [low, 0.0], [low, 0.0], [high, high]]))


def test_ppo_whitens_gae_by_default_and_only_centres_it_without_std_normalisation():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    values = torch.tensor([[0.1, 0.2, 0.3], [0.0, 0.5, 0.0]])
    scores = torch.tensor([1.0, 0.0])
    raw, _ = gae(torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]), values, mask, 1.0, 0.95)
    whitened = by_name("ppo", scores, mask, 1, values=values, lam=0.95)
    centred = by_name("ppo", scores, mask, 1, values=values, lam=0.95, normalize_std=False)
    real = mask.bool()
    assert_close(centred[real], raw[real] - raw[real].mean())
    assert_close(whitened[real], (raw[real] - raw[real].mean()) / raw[real].std(correction=0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_every_estimator_divides_by_a_std_exactly_when_asked(name):
    """The std knob reaches every estimator: on and off give different advantages, in both directions
    from the estimator's own default."""
    rewards = torch.tensor([3.0, 0.0, 1.0, 0.0, 0.0, 2.0])
    values = torch.zeros_like(GROUPED_MASK) if ESTIMATORS[name].needs_critic else None
    on = by_name(name, rewards, GROUPED_MASK, 3, normalize_std=True, values=values)
    off = by_name(name, rewards, GROUPED_MASK, 3, normalize_std=False, values=values)
    default = by_name(name, rewards, GROUPED_MASK, 3, values=values)
    assert not torch.allclose(on, off)
    assert_close(default, on if ESTIMATORS[name].normalize_std else off)
