"""Advantage estimators.

All estimators return per-token advantages ``[batch, response_len]`` that are 0 on padding, so the
policy loss does not care which one produced them. Each is registered under its config name
(``algorithm.name``, see ``catalogue.py``) as a function of one :class:`AdvantageInputs`. Two families:

* token-level: :func:`gae` (critic-based PPO) and :func:`reinforce_pp_advantages` take token rewards;
* group-based: the others take one scalar reward per sequence ``rewards: [batch]`` and a
  ``group_size``; the ``group_size`` samples of one prompt are contiguous rows (rows ``0..g-1`` are
  prompt 0, rows ``g..2g-1`` prompt 1, ...). The per-sequence advantage is broadcast over the row's
  real tokens.

Every estimator takes ``normalize_std``: whether it divides by a std (its group's, or the batch's for the
token-whitening ones); its default is the estimator's own (``algorithm.normalize_advantage_std`` empty).
Centring (the baseline) is part of the estimator and always applies.

Outputs are detached: advantages are targets, not something to backpropagate through.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .masking import (
    as_bool_mask,
    broadcast_to_tokens,
    check_same_shape,
    masked_center,
    masked_whiten,
    place_on_last_token,
)
from .registry import ADVANTAGE_ESTIMATORS

__all__ = [
    "AdvantageInputs",
    "discounted_returns",
    "dr_grpo_advantages",
    "gae",
    "grpo_advantages",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
]


def _float(x: Tensor) -> Tensor:
    """Detach, and promote integer/bool rewards to the default float dtype."""
    x = x.detach()
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


def _grouped(rewards: Tensor, mask: Tensor, group_size: int) -> Tensor:
    """Validate and reshape ``rewards [B]`` to ``[B // group_size, group_size]``."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [batch], got shape {tuple(rewards.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if rewards.shape[0] % group_size != 0:
        raise ValueError(f"batch size {rewards.shape[0]} is not a multiple of group_size {group_size}")
    if mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"mask must be [batch={rewards.shape[0]}, response_len], got {tuple(mask.shape)}")
    return _float(rewards).view(-1, group_size)


def gae(
    rewards_tok: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation for PPO.

    Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage Estimation"
    (2015, arXiv:1506.02438); used by PPO, Schulman et al., "Proximal Policy Optimization Algorithms"
    (2017, arXiv:1707.06347).

    ``delta_t = r_t + gamma * V_{t+1} - V_t`` and ``A_t = delta_t + gamma * lam * A_{t+1}``, with
    ``V`` and ``A`` taken as 0 past the last real token (the response ends the episode). Returns
    ``(advantages, returns)`` where ``returns = advantages + values`` is the critic's regression
    target; both are 0 on padding. ``rewards_tok`` are token-level rewards: building them (score on
    the last token, minus a per-token KL penalty) is the caller's business, see
    :func:`rl_engine.algorithms.kl.kl_penalized_rewards`.
    """
    check_same_shape(mask, rewards_tok=rewards_tok, values=values)
    bool_mask = as_bool_mask(mask)
    rewards = _float(rewards_tok)
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    rewards = torch.where(bool_mask, rewards, zero)
    vals = torch.where(bool_mask, _float(values).to(rewards.dtype), zero)
    real = bool_mask.to(rewards.dtype)

    steps = rewards.shape[1]
    running = torch.zeros_like(rewards[:, 0])
    reversed_advantages = []
    for t in reversed(range(steps)):
        next_value = vals[:, t + 1] if t + 1 < steps else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        # `running` is already 0 after the end of the response, so the recursion stops there.
        running = (delta + gamma * lam * running) * real[:, t]
        reversed_advantages.append(running)
    advantages = torch.stack(reversed_advantages[::-1], dim=1)
    returns = advantages + vals
    return advantages, returns


def grpo_advantages(
    rewards: Tensor,
    mask: Tensor,
    group_size: int,
    eps: float = 1e-6,
    normalize_std: bool = True,
) -> Tensor:
    """GRPO outcome advantage: ``(r_i - mean(group)) / (std(group) + eps)``.

    Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models"
    (2024, arXiv:2402.03300), section 4.1.2.

    The std is the *unbiased* sample std (Bessel's correction, ``torch.std``'s default), as in TRL's
    ``GRPOTrainer``, so our numbers match TRL's. ``eps`` is added to the std (not under the square
    root); TRL hard-codes ``1e-4``. A group whose rewards are all equal gets advantage 0. With
    ``normalize_std=False`` this is :func:`dr_grpo_advantages`. ``group_size == 1`` gives all zeros.
    """
    grouped = _grouped(rewards, mask, group_size)
    advantages = grouped - grouped.mean(dim=1, keepdim=True)
    if normalize_std:
        std = grouped.std(dim=1, keepdim=True, correction=1) if group_size > 1 else torch.zeros_like(grouped)
        advantages = advantages / (std + eps)
    return broadcast_to_tokens(advantages.reshape(-1), mask)


def dr_grpo_advantages(rewards: Tensor, mask: Tensor, group_size: int) -> Tensor:
    """Dr. GRPO advantage: ``r_i - mean(group)``, no division by the group std.

    Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective" (2025,
    arXiv:2503.20783). Dividing by the std up-weights prompts that are nearly always solved or nearly
    always failed (question-level difficulty bias); Dr. GRPO drops it. Pair it with the
    ``seq_mean_token_sum_norm`` aggregation in :func:`rl_engine.algorithms.losses.aggregate` to also
    remove the response-length bias.
    """
    return grpo_advantages(rewards, mask, group_size, normalize_std=False)


def rloo_advantages(
    rewards: Tensor, mask: Tensor, group_size: int, normalize_std: bool = False, eps: float = 1e-6
) -> Tensor:
    """REINFORCE Leave-One-Out: ``r_i - mean_{j != i} r_j``.

    Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human
    Feedback in LLMs" (2024, arXiv:2402.14740); the estimator is from Kool et al. (2019). Excluding
    the sample from its own baseline keeps the estimator unbiased. Equivalent closed form used here:
    ``g / (g - 1) * (r_i - mean(group))``. Needs ``group_size >= 2``. With ``normalize_std`` the
    result is divided by the group's unbiased std plus ``eps``, as GRPO divides.
    """
    if group_size < 2:
        raise ValueError(f"RLOO needs group_size >= 2 (a leave-one-out baseline), got {group_size}")
    grouped = _grouped(rewards, mask, group_size)
    others_sum = grouped.sum(dim=1, keepdim=True) - grouped
    advantages = grouped - others_sum / (group_size - 1)
    if normalize_std:
        advantages = advantages / (grouped.std(dim=1, keepdim=True, correction=1) + eps)
    return broadcast_to_tokens(advantages.reshape(-1), mask)


def discounted_returns(rewards_tok: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """Return-to-go ``G_t = sum_{k >= t} gamma^(k - t) r_k`` over real tokens; 0 on padding."""
    check_same_shape(mask, rewards_tok=rewards_tok)
    bool_mask = as_bool_mask(mask)
    rewards = _float(rewards_tok)
    rewards = torch.where(bool_mask, rewards, torch.zeros((), dtype=rewards.dtype, device=rewards.device))
    real = bool_mask.to(rewards.dtype)
    running = torch.zeros_like(rewards[:, 0])
    reversed_returns = []
    for t in reversed(range(rewards.shape[1])):
        running = (rewards[:, t] + gamma * running) * real[:, t]
        reversed_returns.append(running)
    return torch.stack(reversed_returns[::-1], dim=1)


def reinforce_pp_advantages(
    rewards: Tensor,
    mask: Tensor,
    gamma: float = 1.0,
    eps: float = 1e-8,
    normalize_std: bool = True,
) -> Tensor:
    """REINFORCE++: discounted return, then normalisation over all real tokens of the batch.

    Hu, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models" (2025,
    arXiv:2501.03262). No critic and no per-prompt baseline: the batch-wide token mean and std
    (population std, see :func:`masked_whiten`) play the baseline and scale.

    ``rewards`` is either token-level ``[B, T]`` (e.g. score on the last token minus a per-token KL
    penalty) or one score per sequence ``[B]``, which is then put on the row's last real token.
    ``normalize_std=False`` only subtracts the batch's token mean.
    """
    if rewards.dim() == 1:
        rewards = place_on_last_token(_float(rewards), mask)
    returns = discounted_returns(rewards, mask, gamma)
    return masked_whiten(returns, mask, eps=eps) if normalize_std else masked_center(returns, mask)


def reinforce_pp_baseline_advantages(
    rewards: Tensor,
    mask: Tensor,
    group_size: int,
    eps: float = 1e-8,
    normalize_std: bool = True,
) -> Tensor:
    """REINFORCE++ with a group baseline: ``r_i - mean(group)``, then global token normalisation.

    Hu, "REINFORCE++" (2025, arXiv:2501.03262), the "REINFORCE++-baseline" variant for several samples
    per prompt. Subtracting the group mean removes the prompt's difficulty; the global whitening (one
    mean and std over every real token in the batch, so longer responses weigh more) sets the scale
    without the per-group std of GRPO. ``normalize_std=False`` only subtracts the global token mean.
    """
    grouped = _grouped(rewards, mask, group_size)
    centred = broadcast_to_tokens((grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1), mask)
    return masked_whiten(centred, mask, eps=eps) if normalize_std else masked_center(centred, mask)


# --- by name ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdvantageInputs:
    """What a step hands its estimator. Rows are prompt-major (the ``group_size`` samples of a prompt
    are contiguous)."""

    scores: Tensor  # [B] one reward per sequence
    mask: Tensor  # [B, T] real response tokens
    group_size: int
    normalize_std: bool  # resolved: the config's, else the estimator's default
    # [B, T] token rewards (the score on the last token minus the per-token KL) when the KL penalty goes
    # into the reward; None = the scores alone.
    token_rewards: Tensor | None = None
    values: Tensor | None = None  # [B, T] the critic's (ppo)
    gamma: float = 1.0
    lam: float = 0.95

    def rewards_per_token(self) -> Tensor:
        return (
            self.token_rewards
            if self.token_rewards is not None
            else place_on_last_token(_float(self.scores), self.mask)
        )


Advantages = tuple[Tensor, Tensor | None]  # (advantages [B, T], the critic's regression targets or None)


@ADVANTAGE_ESTIMATORS.register("ppo")
def _ppo(inputs: AdvantageInputs) -> Advantages:
    if inputs.values is None:
        raise ValueError("ppo needs the critic's values")
    advantages, returns = gae(inputs.rewards_per_token(), inputs.values, inputs.mask, inputs.gamma, inputs.lam)
    scaled = masked_whiten(advantages, inputs.mask) if inputs.normalize_std else masked_center(advantages, inputs.mask)
    return scaled, returns


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
def _reinforce_pp(inputs: AdvantageInputs) -> Advantages:
    rewards = inputs.rewards_per_token()
    return reinforce_pp_advantages(rewards, inputs.mask, inputs.gamma, normalize_std=inputs.normalize_std), None


@ADVANTAGE_ESTIMATORS.register("grpo")
@ADVANTAGE_ESTIMATORS.register("dr_grpo")  # the same estimator; its std default differs (catalogue)
def _grpo(inputs: AdvantageInputs) -> Advantages:
    return grpo_advantages(inputs.scores, inputs.mask, inputs.group_size, normalize_std=inputs.normalize_std), None


@ADVANTAGE_ESTIMATORS.register("rloo")
def _rloo(inputs: AdvantageInputs) -> Advantages:
    return rloo_advantages(inputs.scores, inputs.mask, inputs.group_size, normalize_std=inputs.normalize_std), None


@ADVANTAGE_ESTIMATORS.register("reinforce_pp_baseline")
def _reinforce_pp_baseline(inputs: AdvantageInputs) -> Advantages:
    advantages = reinforce_pp_baseline_advantages(
        inputs.scores, inputs.mask, inputs.group_size, normalize_std=inputs.normalize_std
    )
    return advantages, None
