"""GSPO: the importance ratio and its clip at the sequence level.

Zheng et al., "Group Sequence Policy Optimization" (2025, arXiv:2507.18071), eq. 5-7: one ratio per
response, the geometric mean of its token ratios (length-normalised, so long and short responses
clip alike), ``s_i = exp(mean_t (log pi(y_t) - log pi_old(y_t)))``; per token
``max(-A * s_i, -A * clip(s_i, 1 - clip_low, 1 + clip_high))``. The paper averages over sequences
(``seq_mean_token_mean``, the default) and clips tightly (3e-4 / 4e-4 in its experiments), because a
sequence ratio moves far less than a token's. The gradient flows through ``s_i`` into every token of
the sequence: ``d s_i = s_i / |y_i| * sum_t d log pi(y_t)``. Equals TRL's
``importance_sampling_level="sequence"`` (with ``loss_type="grpo"``) for the same clip range.
"""

from __future__ import annotations

import torch

from rl_engine.algorithms.losses import ClipRange, LossInputs, LossTerms
from rl_engine.algorithms.masking import masked_mean
from rl_engine.algorithms.registry import POLICY_LOSS_FUNCTIONS


@POLICY_LOSS_FUNCTIONS.register("gspo")
def gspo(inputs: LossInputs, clip: ClipRange) -> LossTerms:
    adv = inputs.advantages
    sequence_ratio = torch.exp(masked_mean(inputs.log_ratio, inputs.mask, dim=-1)).unsqueeze(-1)
    loss = torch.maximum(-adv * sequence_ratio, -adv * sequence_ratio.clamp(1.0 - clip.low, 1.0 + clip.high))
    s = sequence_ratio.detach().expand_as(adv)
    return LossTerms(loss, s, (s > 1.0 + clip.high) & (adv > 0), (s < 1.0 - clip.low) & (adv < 0))
