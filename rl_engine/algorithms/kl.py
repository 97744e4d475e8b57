"""Per-token KL estimators between the policy and the frozen reference model.

Schulman, "Approximating KL Divergence" (2020, http://joschu.net/blog/kl-approx.html). With tokens
sampled from the policy ``p`` and ``log_ratio = log p(x) - log q_ref(x)``:

* ``k1 = log_ratio`` — unbiased for KL(p || q_ref), high variance, can be negative per token;
* ``k2 = 0.5 * log_ratio ** 2`` — biased but low variance, always >= 0;
* ``k3 = exp(-log_ratio) + log_ratio - 1`` — unbiased and always >= 0 (used by GRPO as its loss term).

Two ways to use them: as a loss term (``beta * kl`` added per token, GRPO style) or folded into the
reward before computing advantages (PPO / REINFORCE++ style, :func:`kl_penalized_rewards`).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from .masking import as_bool_mask, check_same_shape, place_on_last_token

__all__ = ["K3_LOG_RATIO_CLAMP", "KLEstimator", "kl_estimate", "kl_penalized_rewards"]

KLEstimator = Literal["k1", "k2", "k3"]

#: k3 exponentiates ``log q_ref - log p``. A token the policy has made near-impossible but the
#: reference still likes gives a huge positive value, and ``exp`` overflows to inf (then NaN
#: gradients). Clamping the log-ratio to +-20 (e^20 ~ 4.9e8) keeps it finite; it only changes tokens
#: that are already pathological, and their gradient through k3 becomes 0 in that regime.
K3_LOG_RATIO_CLAMP = 20.0


def kl_estimate(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    estimator: KLEstimator = "k3",
    mask: Tensor | None = None,
) -> Tensor:
    """Per-token estimate ``[B, T]`` of KL(policy || reference) from sampled-token log-probs.

    Schulman, "Approximating KL Divergence" (2020). ``logprobs`` are the policy's log-probs of the
    sampled tokens, ``ref_logprobs`` the reference model's for the same tokens. For ``k3`` the
    log-ratio is clamped to ``+-K3_LOG_RATIO_CLAMP`` before ``exp`` to avoid overflow. When ``mask``
    is given, padded positions are 0 (and garbage there cannot produce NaN gradients).
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} differ")
    log_ratio = logprobs - ref_logprobs
    if mask is not None:
        check_same_shape(mask, logprobs=logprobs)
        # Zero the padded log-ratios *before* any nonlinearity so exp() never sees garbage.
        log_ratio = torch.where(as_bool_mask(mask), log_ratio, torch.zeros_like(log_ratio))

    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        ref_minus_policy = (-log_ratio).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
        return torch.exp(ref_minus_policy) - ref_minus_policy - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; expected 'k1', 'k2' or 'k3'")


def kl_penalized_rewards(scores: Tensor, kl: Tensor, mask: Tensor, coef: float) -> Tensor:
    """Token rewards for "KL in the reward" mode: ``-coef * kl_t`` everywhere, plus the score at the end.

    Ziegler et al., "Fine-Tuning Language Models from Human Preferences" (2019, arXiv:1909.08593);
    Ouyang et al., "Training language models to follow instructions with human feedback" (2022).
    ``scores`` ``[B]`` is the sequence-level reward, added on each row's last real token; ``kl``
    ``[B, T]`` is a per-token estimate (:func:`kl_estimate`). Padding is 0. Feed the result to
    :func:`rl_engine.algorithms.advantages.gae` or ``reinforce_pp_advantages``.
    """
    check_same_shape(mask, kl=kl)
    bool_mask = as_bool_mask(mask)
    penalty = torch.where(bool_mask, -coef * kl, torch.zeros((), dtype=kl.dtype, device=kl.device))
    return penalty + place_on_last_token(scores.to(kl.dtype), mask)
