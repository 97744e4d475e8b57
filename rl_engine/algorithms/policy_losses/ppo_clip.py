"""PPO's clipped surrogate, per token, with clip-higher and dual-clip.

Schulman et al., "Proximal Policy Optimization Algorithms" (2017, arXiv:1707.06347): per token
``max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))`` with ``r = exp(logp - old_logp)``.

* Clip-higher: ``clip_high > clip_low`` lets low-probability tokens grow more before the clip stops
  them, against entropy collapse (DAPO, Yu et al. 2025, arXiv:2503.14476; e.g. 0.2 / 0.28).
* Dual-clip: for negative advantages the loss above grows without bound as ``r`` grows; with
  ``dual_clip = c > 1`` it is capped at ``-c * A`` (= ``c * |A|``) (Ye et al., "Mastering Complex
  Control in MOBA Games with Deep Reinforcement Learning", 2020, arXiv:1912.09729).

A token is clipped high when ``r > 1 + clip_high`` with ``A > 0``, low when ``r < 1 - clip_low`` with
``A < 0``: there the clipped term is the one taken and the token gets no gradient.
"""

from __future__ import annotations

import torch

from rl_engine.algorithms.losses import ClipRange, LossInputs, LossTerms
from rl_engine.algorithms.registry import POLICY_LOSS_FUNCTIONS


@POLICY_LOSS_FUNCTIONS.register("ppo_clip")
def ppo_clip(inputs: LossInputs, clip: ClipRange) -> LossTerms:
    adv = inputs.advantages
    ratio = torch.exp(inputs.log_ratio)
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - clip.low, 1.0 + clip.high))
    capped = None
    r = ratio.detach()
    if clip.dual is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * clip.dual), loss)
        # For A < 0 the clipped loss is |A| * max(r, 1 - clip_low); since dual > 1 it is capped iff r > dual.
        capped = (adv < 0) & (r > clip.dual)
    return LossTerms(loss, r, (r > 1.0 + clip.high) & (adv > 0), (r < 1.0 - clip.low) & (adv < 0), capped)
