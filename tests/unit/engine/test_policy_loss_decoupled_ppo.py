"""Decoupled PPO (policy_losses/decoupled_ppo.py) against hand-computed values: the clip around the
proximal policy, the weight pi_proximal / pi_behaviour, and its composition with the rollout correction."""

import math

import torch
from torch.testing import assert_close

from rl_engine.algorithms import CorrectionInputs, policy_loss, rollout_correction

F64 = {"dtype": torch.float64}
# Three tokens, all with A = +1. Against the proximal policy the trained one has ratios r = 1.1, 1.5, 0.9;
# the behaviour policy (the stale rollout engine) gave them proximal / behaviour = w = 2, 0.5, 8.
PROXIMAL = torch.full((1, 3), -2.0, **F64)
RATIOS = torch.tensor([[1.1, 1.5, 0.9]], **F64)
BEHAVIOUR_WEIGHTS = torch.tensor([[2.0, 0.5, 8.0]], **F64)
BEHAVIOUR = PROXIMAL - BEHAVIOUR_WEIGHTS.log()
ADV = torch.ones(1, 3, **F64)
MASK = torch.ones(1, 3)


def _trained() -> torch.Tensor:
    return (PROXIMAL + RATIOS.log()).requires_grad_()


def test_the_clip_is_around_the_proximal_policy_and_the_weight_is_proximal_over_behaviour():
    logp = _trained()
    loss, stats = policy_loss(logp, PROXIMAL, ADV, MASK, name="decoupled_ppo", behaviour_logprobs=BEHAVIOUR)
    # Per token w * max(-A r, -A clip(r, .8, 1.2)): 2 * -1.1, 0.5 * -1.2 (clipped), 8 * -0.9; mean of 3.
    assert_close(loss, torch.tensor((2 * -1.1 + 0.5 * -1.2 + 8 * -0.9) / 3, **F64))
    assert_close(stats["clip_ratio_high"], torch.tensor(1 / 3, **F64))  # judged on r, not on w * r
    loss.backward()
    # d/d logp of -w r A = -w r: the clipped token gets none.
    assert_close(logp.grad, torch.tensor([[-2 * 1.1 / 3, 0.0, -8 * 0.9 / 3]], **F64))


def test_the_rollout_corrections_weights_replace_the_raw_ratio_instead_of_multiplying_it():
    # token_tis with high 5: w = 2, 0.5, 5 (the 8 truncated) -- AReaL's weight cap as truncation.
    correction = rollout_correction(
        "token_tis", CorrectionInputs(behaviour_logprobs=BEHAVIOUR, proximal_logprobs=PROXIMAL, mask=MASK), 0.0, 5.0
    )
    loss, _ = policy_loss(
        _trained(),
        PROXIMAL,
        ADV,
        MASK,
        name="decoupled_ppo",
        weights=correction.weights,
        behaviour_logprobs=BEHAVIOUR,
    )
    assert_close(loss, torch.tensor((2 * -1.1 + 0.5 * -1.2 + 5 * -0.9) / 3, **F64))
    # token_mis with high 5 drops the token above the cap (AReaL's behav_imp_weight_cap), the rest as is.
    masked = rollout_correction(
        "token_mis", CorrectionInputs(behaviour_logprobs=BEHAVIOUR, proximal_logprobs=PROXIMAL, mask=MASK), 0.0, 5.0
    )
    loss, _ = policy_loss(_trained(), PROXIMAL, ADV, MASK, name="decoupled_ppo", weights=masked.weights)
    assert_close(loss, torch.tensor((2 * -1.1 + 0.5 * -1.2 + 0.0) / 3, **F64))


def test_without_a_behaviour_policy_it_is_ppo_clip():
    logp = _trained()
    decoupled, _ = policy_loss(logp, PROXIMAL, ADV, MASK, name="decoupled_ppo")
    ppo, _ = policy_loss(logp, PROXIMAL, ADV, MASK, name="ppo_clip")
    assert_close(decoupled, ppo)
    assert math.isclose(float(ppo.detach()), (-1.1 - 1.2 - 0.9) / 3)


def test_padding_gets_no_weight_whatever_the_behaviour_log_probs_hold():
    behaviour = BEHAVIOUR.clone()
    behaviour[0, 2] = float("nan")
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    logp = _trained()
    loss, _ = policy_loss(logp, PROXIMAL, ADV, mask, name="decoupled_ppo", behaviour_logprobs=behaviour)
    assert_close(loss, torch.tensor((2 * -1.1 + 0.5 * -1.2) / 2, **F64))
    loss.backward()
    assert torch.isfinite(logp.grad).all()
