"""CISPO (policy_losses/cispo.py) against hand-computed values; its TRL cross-check is in test_trl_crosscheck.py."""

import math

import torch
from torch.testing import assert_close

from rl_engine.algorithms import policy_loss
from rl_engine.algorithms.catalogue import POLICY_LOSSES

F64 = {"dtype": torch.float64}


def test_cispo_weighs_each_log_prob_by_its_clipped_ratio_and_keeps_every_gradient():
    # Ratios 1.5, 6 and 0.5 with A = +1, +1, -1; clip_low 1 (no lower bound), clip_high 4 (weight <= 5):
    # weights 1.5, 5, 0.5. Loss per token -w * A * logp, averaged over the 3 tokens.
    old = torch.full((1, 3), -3.0, **F64)
    logp = (old + torch.tensor([[1.5, 6.0, 0.5]], **F64).log()).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0]], **F64)
    loss, stats = policy_loss(logp, old, adv, torch.ones(1, 3), 1.0, 4.0, name="cispo")
    lp = logp.detach()[0]
    expected = (-1.5 * lp[0] - 5.0 * lp[1] + 0.5 * lp[2]) / 3
    assert_close(loss, expected)
    assert_close(stats["clip_ratio_high"], torch.tensor(1 / 3, **F64))

    loss.backward()
    # d/d logp = -w * A / 3: the truncated token (ratio 6) still learns, with weight 5.
    assert_close(logp.grad, torch.tensor([[-1.5 / 3, -5.0 / 3, 0.5 / 3]], **F64))


def test_cispo_at_ratio_one_is_reinforce():
    old = torch.tensor([[-1.0, -2.0]], **F64)
    logp = old.clone().requires_grad_()
    loss, _ = policy_loss(logp, old, torch.tensor([[2.0, -1.0]], **F64), torch.ones(1, 2), 1.0, 4.0, name="cispo")
    loss.backward()
    assert_close(loss, torch.tensor((2.0 * 1.0 + -1.0 * 2.0) / 2, **F64))  # -A * logp, mean
    assert_close(logp.grad, torch.tensor([[-1.0, 0.5]], **F64))


def test_cispo_defaults_are_its_papers():
    spec = POLICY_LOSSES["cispo"]
    assert (spec.clip_low, spec.clip_high, spec.loss_agg) == (1.0, 4.0, "token_mean")
    assert math.isclose(1 + spec.clip_high, 5.0)  # the largest weight, ScaleRL's and TRL's recommended 5
