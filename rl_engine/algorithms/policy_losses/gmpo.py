"""GMPO: maximise the geometric mean of the token-level clipped ratios of each sequence.

Zhao et al., "Geometric-Mean Policy Optimization" (2025, arXiv:2507.20673), eq. 4 and its code: GRPO's
arithmetic mean of token terms is dominated by tokens with outlier ratios; the geometric mean is not.
Per token the log-ratio is clipped in log space, pessimistically for the advantage's sign
(``A > 0``: ``min(l_t, clip_high)``; ``A < 0``: ``max(l_t, -clip_low)``), then per sequence
``loss_i = -A_i * exp(mean_t l_t_clipped)`` with ``A_i`` the mean of the sequence's token advantages.
The paper's range is ``(e^-0.4, e^0.4)`` (``clip_low = clip_high = 0.4``, bounds on the *log*-ratio) and
its loss is the mean over sequences (``seq_mean_token_mean``: ``loss_i`` is spread over the sequence's
tokens so every aggregation applies). TRL 1.16 has no GMPO.
"""

from __future__ import annotations

import torch

from rl_engine.algorithms.losses import ClipRange, LossInputs, LossTerms
from rl_engine.algorithms.masking import masked_mean
from rl_engine.algorithms.registry import POLICY_LOSS_FUNCTIONS


@POLICY_LOSS_FUNCTIONS.register("gmpo")
def gmpo(inputs: LossInputs, clip: ClipRange) -> LossTerms:
    adv, log_ratio, mask = inputs.advantages, inputs.log_ratio, inputs.mask
    sign = torch.sign(adv)
    clamped = log_ratio.clamp(-clip.low, clip.high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)  # 0 where A = 0: no signal anyway
    sequence_ratio = torch.exp(masked_mean(pessimistic, mask, dim=-1))
    sequence_advantage = masked_mean(adv, mask, dim=-1)
    loss = (-sequence_advantage * sequence_ratio).unsqueeze(-1).expand_as(adv)
    ratio = sequence_ratio.detach().unsqueeze(-1).expand_as(adv)
    lr = log_ratio.detach()
    return LossTerms(loss, ratio, (lr > clip.high) & (adv > 0), (lr < -clip.low) & (adv < 0))
