"""GMPO (policy_losses/gmpo.py) against hand-computed values. TRL 1.16 has no GMPO to cross-check."""

import math

import torch
from torch.testing import assert_close

from rl_engine.algorithms import policy_loss
from rl_engine.algorithms.catalogue import POLICY_LOSSES

F64 = {"dtype": torch.float64}


def batch():
    """Row 0, A = +1: log-ratios 0.5, -0.5, 0.1. Row 1, A = -1: log-ratios 0.5, -0.6 (one padded slot)."""
    old = torch.full((2, 3), -2.0, **F64)
    logp = (old + torch.tensor([[0.5, -0.5, 0.1], [0.5, -0.6, 0.0]], **F64)).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]], **F64)
    return logp, old, adv, torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_gmpo_takes_the_geometric_mean_of_pessimistically_clipped_token_ratios():
    logp, old, adv, mask = batch()
    loss, stats = policy_loss(logp, old, adv, mask, 0.4, 0.4, agg="seq_mean_token_mean", name="gmpo")
    # Row 0 (A > 0): min(l, clip(l)) = 0.4, -0.5, 0.1 -> mean 0 -> ratio 1 -> loss -1.
    # Row 1 (A < 0): max(l, clip(l)) = 0.5, -0.4 -> mean 0.05 -> loss +e^0.05.
    assert_close(loss, torch.tensor((-1.0 + math.exp(0.05)) / 2, **F64))
    # Clipped: row 0's 0.5 (above 0.4 with A > 0) and row 1's -0.6 (below -0.4 with A < 0): 2 of 5 tokens.
    assert_close(stats["clip_ratio_high"], torch.tensor(1 / 5, **F64))
    assert_close(stats["clip_ratio_low"], torch.tensor(1 / 5, **F64))

    loss.backward()
    # d loss_i / d l_t = -A_i * ratio_i / |y_i| for unclipped tokens, 0 for clipped ones; / 2 sequences.
    row0 = -1.0 * 1.0 / 3 / 2
    row1 = math.exp(0.05) / 2 / 2
    assert_close(logp.grad, torch.tensor([[0.0, row0, row0], [row1, 0.0, 0.0]], **F64))


def test_gmpo_with_wide_bounds_is_the_plain_geometric_mean():
    logp, old, adv, mask = batch()
    loss, _ = policy_loss(logp, old, adv, mask, 10.0, 10.0, agg="seq_mean_token_mean", name="gmpo")
    row0 = -math.exp((0.5 - 0.5 + 0.1) / 3)
    row1 = math.exp((0.5 - 0.6) / 2)
    assert_close(loss, torch.tensor((row0 + row1) / 2, **F64))


def test_gmpo_defaults_are_its_papers():
    spec = POLICY_LOSSES["gmpo"]
    assert (spec.clip_low, spec.clip_high, spec.loss_agg) == (0.4, 0.4, "seq_mean_token_mean")
