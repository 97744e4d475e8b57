"""GSPO (policy_losses/gspo.py) against hand-computed values; its TRL cross-check is in test_trl_crosscheck.py."""

import math

import torch
from torch.testing import assert_close

from rl_engine.algorithms import policy_loss
from rl_engine.algorithms.catalogue import POLICY_LOSSES

F64 = {"dtype": torch.float64}


def batch():
    """Row 0: token log-ratios 0.1 and 0.3, mean 0.2, s = e^0.2 = 1.2214, A = +1.
    Row 1: one token, log-ratio -0.2, s = e^-0.2 = 0.8187, A = -1 (plus one padded slot)."""
    old = torch.tensor([[-1.0, -2.0], [-1.5, 0.0]], **F64)
    logp = (old + torch.tensor([[0.1, 0.3], [-0.2, 0.0]], **F64)).requires_grad_()
    adv = torch.tensor([[1.0, 1.0], [-1.0, 0.0]], **F64)
    return logp, old, adv, torch.tensor([[1, 1], [1, 0]])


def test_gspo_clips_the_geometric_mean_ratio_of_each_sequence():
    logp, old, adv, mask = batch()
    loss, stats = policy_loss(logp, old, adv, mask, 0.2, 0.2, agg="seq_mean_token_mean", name="gspo")
    # Row 0: s = 1.2214 > 1.2 with A > 0 -> clipped, -1.2 on each token. Row 1: s = 0.8187 within
    # [0.8, 1.2] -> -A * s = 0.8187. Mean over the two sequences.
    assert_close(loss, torch.tensor((-1.2 + math.exp(-0.2)) / 2, **F64))
    assert_close(stats["clip_ratio_high"], torch.tensor(2 / 3, **F64))  # both real tokens of row 0
    assert_close(stats["clip_ratio_low"], torch.tensor(0.0, **F64))
    assert_close(stats["ratio_max"], torch.tensor(math.exp(0.2), **F64))

    loss.backward()
    # Row 0 is clipped: no gradient. Row 1: d(s)/d logp = s / |y| = s, times 1/2 for the sequence mean.
    assert_close(logp.grad, torch.tensor([[0.0, 0.0], [math.exp(-0.2) / 2, 0.0]], **F64))


def test_gspo_spreads_the_sequence_gradient_evenly_over_its_tokens():
    logp, old, adv, mask = batch()
    loss, _ = policy_loss(logp, old, adv, mask, 0.5, 0.5, agg="seq_mean_token_mean", name="gspo")
    loss.backward()
    # Unclipped now: row 0's loss is -s; d/d logp_t = -s / 2 for each of its 2 tokens, / 2 sequences.
    expected_row0 = -math.exp(0.2) / 2 / 2
    assert_close(logp.grad[0], torch.tensor([expected_row0, expected_row0], **F64))


def test_gspo_defaults_are_its_papers():
    spec = POLICY_LOSSES["gspo"]
    assert (spec.clip_low, spec.clip_high, spec.loss_agg, spec.level) == (3e-4, 4e-4, "seq_mean_token_mean", "sequence")
