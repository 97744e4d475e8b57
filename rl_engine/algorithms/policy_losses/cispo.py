"""CISPO: a clipped, stop-gradient importance weight on the log-prob, so no token loses its gradient.

MiniMax, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention" (2025,
arXiv:2506.13585), eq. 4-5: per token ``-sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * log pi(y_t)``.
PPO's clip zeroes the gradient of the tokens it clips, often the rare "fork" tokens of a reasoning
chain; CISPO clips only the weight, and every token keeps ``weight * A * d log pi``. The paper sets no
lower bound (``clip_low = 1``: the weight is ``>= 0`` anyway) and tunes the upper one; ScaleRL (Khatri et
al. 2025, arXiv:2510.13786) uses a maximum weight of 4-5, so the default ``clip_high`` is 4 (weight <= 5).
Averaged over tokens (``token_mean``). Equals TRL's ``loss_type="cispo"`` with ``epsilon_high =
1 + clip_high`` (TRL's value is the largest weight itself).
"""

from __future__ import annotations

import torch

from rl_engine.algorithms.losses import ClipRange, LossInputs, LossTerms
from rl_engine.algorithms.registry import POLICY_LOSS_FUNCTIONS


@POLICY_LOSS_FUNCTIONS.register("cispo")
def cispo(inputs: LossInputs, clip: ClipRange) -> LossTerms:
    ratio = torch.exp(inputs.log_ratio).detach()
    weight = ratio.clamp(1.0 - clip.low, 1.0 + clip.high)
    loss = -weight * inputs.advantages * inputs.logprobs
    return LossTerms(loss, ratio, ratio > 1.0 + clip.high, ratio < 1.0 - clip.low)
