"""The entropy the transformers rollout records with each sampled token (the per-token view's `entropy`
column of a step's rollout file)."""

from __future__ import annotations

import math

import torch

from rl_engine.rollout import SampledTokenLogprobs


def test_the_recorded_entropy_is_that_of_the_distribution_sampled_from():
    recorder = SampledTokenLogprobs()
    # Step 1: uniform over 4 tokens (H = ln 4); step 2: top-k left two at 1:3 odds (-inf elsewhere).
    recorder(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 4))
    recorder(torch.tensor([[0, 2]]), torch.tensor([[0.0, math.log(3.0), -math.inf, -math.inf]]))
    entropies = recorder.entropies(torch.tensor([[2, 1]]))
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(entropies, torch.tensor([[math.log(4.0), expected]]))
