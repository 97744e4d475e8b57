"""Decoupled PPO: the clip against the proximal policy, the importance weight against the behaviour one.

Hilton et al., "Batch size-invariance for policy optimization" (2022, arXiv:2110.00641), as AReaL runs
it for asynchronous RL (Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System
for Language Reasoning", arXiv:2505.24298, eq. 5). Three policies: the behaviour policy that sampled the
token (the rollout engine, up to `backends.max_staleness` updates behind), the proximal policy (the
trainer's weights before this update, `old_logprobs`) and the one being trained. Per token

    w_t * max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high)),   r = pi_theta / pi_proximal,
    w_t = pi_proximal(y_t) / pi_behaviour(y_t)   (detached)

so the trust region is around recent weights, however stale the sample, while ``w`` corrects for where
the sample came from. ``w`` is the rollout correction's weight when one weighs (`token_tis` truncates it
at ``high``; `token_mis` with ``high = c`` drops the tokens above ``c``: AReaL's ``behav_imp_weight_cap``),
else the raw ratio. Clip-higher and dual-clip as in ``ppo_clip``; with the behaviour policy equal to the
proximal one (sync mode, no mismatch) ``w = 1`` and it is ``ppo_clip``.
"""

from __future__ import annotations

from rl_engine.algorithms.losses import ClipRange, LossInputs, LossTerms
from rl_engine.algorithms.policy_losses.ppo_clip import ppo_clip
from rl_engine.algorithms.registry import POLICY_LOSS_FUNCTIONS


@POLICY_LOSS_FUNCTIONS.register("decoupled_ppo")
def decoupled_ppo(inputs: LossInputs, clip: ClipRange) -> LossTerms:
    terms = ppo_clip(inputs, clip)
    if inputs.behaviour_weights is None:
        return terms
    return LossTerms(
        terms.per_token * inputs.behaviour_weights, terms.ratio, terms.clipped_high, terms.clipped_low, terms.capped
    )
