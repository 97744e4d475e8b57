"""Policy and value losses, loss aggregation, and entropy.

The policy losses themselves live one per file in ``policy_losses/`` and are chosen by name
(:func:`policy_loss`); each returns per-token terms, and what they share (padding, the rollout
correction's weights, aggregation, the clip and ratio statistics) is done once here.

Per-token losses are ``[batch, response_len]``; :func:`aggregate` turns them into a scalar. The
aggregation mode is a real algorithmic choice (it decides how much a long response weighs against a
short one), so it is an explicit argument everywhere rather than a hidden default of each loss.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor

from . import catalogue
from .kl import kl_estimate
from .masking import as_bool_mask, check_same_shape, masked_mean, masked_sum, masked_whiten
from .registry import POLICY_LOSS_FUNCTIONS

__all__ = [
    "AGGREGATION_MODES",
    "LOG_RATIO_CLAMP",
    "AggregationMode",
    "ClipRange",
    "LossInputs",
    "LossTerms",
    "aggregate",
    "entropy_from_logits",
    "masked_mean",
    "masked_whiten",
    "policy_loss",
    "value_loss",
]

AggregationMode = Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
AGGREGATION_MODES: tuple[str, ...] = catalogue.AGGREGATION_MODES

#: The importance ratio is ``exp(logp - old_logp)``. The log-ratio is clamped to +-20 before ``exp``
#: so a wildly off-policy token yields a large finite ratio instead of inf (and NaN gradients).
#: Real batches never come near it (PPO clips at ratios around 1 +- 0.2).
LOG_RATIO_CLAMP = 20.0


def aggregate(
    loss_tok: Tensor,
    mask: Tensor,
    mode: AggregationMode = "token_mean",
    norm_constant: int | None = None,
) -> Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar, ignoring padding.

    * ``token_mean`` — sum over all real tokens / number of real tokens: every token weighs the same
      (DAPO, Yu et al. 2025, arXiv:2503.14476; TRL's ``bnpo``).
    * ``seq_mean_token_mean`` — mean over tokens within each sequence, then mean over the ``B``
      sequences: every sequence weighs the same, so tokens of short responses weigh more (the original
      GRPO, Shao et al. 2024; TRL's ``grpo``).
    * ``seq_mean_token_sum`` — sum over tokens within each sequence, then mean over sequences.
    * ``seq_mean_token_sum_norm`` — sum over all real tokens / (``B`` * ``norm_constant``), where
      ``norm_constant`` is a fixed number such as the generation budget (max response length); it
      removes the length bias without making the scale depend on the batch (Dr. GRPO, Liu et al.
      2025, arXiv:2503.20783; TRL's ``dr_grpo``). ``norm_constant`` is required for this mode.

    Sequence means divide by ``B`` including rows with no real token (they contribute 0).
    """
    check_same_shape(mask, loss_tok=loss_tok)
    if mode == "token_mean":
        return masked_mean(loss_tok, mask)
    if mode == "seq_mean_token_sum":
        return masked_sum(loss_tok, mask, dim=-1).mean()
    if mode == "seq_mean_token_mean":
        return masked_mean(loss_tok, mask, dim=-1).mean()
    if mode == "seq_mean_token_sum_norm":
        if norm_constant is None or norm_constant <= 0:
            raise ValueError("seq_mean_token_sum_norm needs a positive norm_constant (the max response length)")
        return masked_sum(loss_tok, mask) / (loss_tok.shape[0] * norm_constant)
    raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGGREGATION_MODES}")


@dataclass(frozen=True)
class LossInputs:
    """What a policy loss sees, padding already neutralised: ``log_ratio``, ``advantages`` and
    ``logprobs`` are 0 there, so no loss can let garbage in a padded slot reach ``exp`` or autograd."""

    logprobs: Tensor  # [B, T] the policy being trained (differentiable)
    old_logprobs: Tensor  # [B, T] the policy the update started from (detached)
    log_ratio: Tensor  # [B, T] logprobs - old_logprobs, clamped to +-LOG_RATIO_CLAMP
    advantages: Tensor  # [B, T] detached
    mask: Tensor  # [B, T] bool, real tokens
    # [B, T] detached, 0 on padding: pi_proximal / pi_behaviour per token, for the losses that weigh by it
    # (`PolicyLossSpec.behaviour_weighted`); None where the behaviour policy is unknown (weight 1).
    behaviour_weights: Tensor | None = None


@dataclass(frozen=True)
class ClipRange:
    low: float
    high: float
    dual: float | None = None  # the dual-clip cap (losses whose catalogue entry allows it)


@dataclass(frozen=True)
class LossTerms:
    """A policy loss's per-token terms, before correction weights and aggregation."""

    per_token: Tensor  # [B, T]
    ratio: Tensor  # [B, T] detached: the ratio the loss clipped (the token's, or its sequence's broadcast)
    clipped_high: Tensor  # [B, T] bool: where the upper clip took the token's gradient away (or truncated its weight)
    clipped_low: Tensor  # [B, T] bool: the same for the lower clip
    capped: Tensor | None = None  # [B, T] bool: where the dual-clip cap was active


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: AggregationMode = "token_mean",
    norm_constant: int | None = None,
    *,
    name: str = "ppo_clip",
    weights: Tensor | None = None,
    behaviour_logprobs: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy loss registered as ``name`` (``policy_losses/<name>.py``), weighted and aggregated.

    ``advantages`` is ``[B, T]`` (or ``[B]``, broadcast over tokens). ``weights`` ``[B, T]`` are the
    rollout correction's (``rl_engine.algorithms.corrections``): each token's loss is multiplied by its
    weight before aggregation, so a weight of 0 drops the token but keeps it in the denominators, as
    TRL applies its importance-sampling correction. The KL and entropy terms are not weighted.
    A behaviour-weighted loss (decoupled PPO) takes the behaviour importance ratio in its inputs
    instead: the correction's ``weights`` when given (the ratio truncated or masked), else
    ``exp(old_logprobs - behaviour_logprobs)`` from the rollout engine's ``behaviour_logprobs``.
    The log-ratio is clamped to ``+-LOG_RATIO_CLAMP`` before any loss sees it. Returns
    ``(loss, stats)``; the stats are detached scalars:

    * ``clip_ratio`` — fraction of real tokens where a clip was active (PPO: the clipped term is the
      one taken, so the token gets no gradient from the surrogate), split into ``clip_ratio_high`` /
      ``clip_ratio_low``;
    * ``dual_clip_ratio`` — fraction of real tokens where the dual-clip cap is active (0 without it);
    * ``approx_kl`` — token mean of the k3 estimate of KL(old || new) (the tokens were sampled from the
      old policy): ``(r - 1) - log r``; >= 0, unbiased (Schulman, "Approximating KL Divergence", 2020);
    * ``ratio_mean``, ``ratio_max``, ``ratio_min`` — of the ratio the loss clipped, over real tokens.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logprobs)
    check_same_shape(mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
    if weights is not None:
        check_same_shape(mask, weights=weights)
    if clip_low < 0 or clip_high < 0:
        raise ValueError("clip_low and clip_high must be >= 0")
    loss_fn = POLICY_LOSS_FUNCTIONS.get(name)
    if dual_clip is not None:
        if not catalogue.POLICY_LOSSES[name].dual_clip:
            raise ValueError(f"policy loss {name!r} has no dual clip")
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (it caps the loss at dual_clip * |A|), got {dual_clip}")

    bool_mask = as_bool_mask(mask)
    zeros = torch.zeros_like(logprobs)
    log_ratio = torch.where(bool_mask, logprobs - old_logprobs, zeros).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    inputs = LossInputs(
        logprobs=torch.where(bool_mask, logprobs, zeros),
        old_logprobs=torch.where(bool_mask, old_logprobs.detach(), zeros),
        log_ratio=log_ratio,
        advantages=torch.where(bool_mask, advantages.detach(), torch.zeros_like(advantages)).to(logprobs.dtype),
        mask=bool_mask,
    )
    if weights is not None:
        # Padding's weight is 0 whatever it holds: a sequence loss spreads over padded slots too, and a NaN
        # weight there would reach the real tokens' gradient through the product.
        weights = torch.where(bool_mask, weights.detach().to(logprobs.dtype), zeros)
    if catalogue.POLICY_LOSSES[name].behaviour_weighted:
        if weights is None and behaviour_logprobs is not None:
            check_same_shape(mask, behaviour_logprobs=behaviour_logprobs)
            log_weight = (inputs.old_logprobs - behaviour_logprobs.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
            weights = torch.where(bool_mask, torch.exp(log_weight).to(logprobs.dtype), zeros)
        inputs = replace(inputs, behaviour_weights=weights)
        weights = None  # the loss weighed by them itself
    terms = loss_fn(inputs, ClipRange(clip_low, clip_high, dual_clip))
    per_token = terms.per_token if weights is None else terms.per_token * weights
    loss = aggregate(per_token, mask, agg, norm_constant)

    with torch.no_grad():
        r = terms.ratio.detach()
        high = terms.clipped_high & bool_mask
        low = terms.clipped_low & bool_mask
        dual = terms.capped & bool_mask if terms.capped is not None else torch.zeros_like(bool_mask)
        as_float = r.dtype
        any_token = bool_mask.any()  # kept on the device: a host `bool()` here would wait for the GPU
        stats = {
            "clip_ratio": masked_mean((high | low).to(as_float), bool_mask),
            "clip_ratio_high": masked_mean(high.to(as_float), bool_mask),
            "clip_ratio_low": masked_mean(low.to(as_float), bool_mask),
            "dual_clip_ratio": masked_mean(dual.to(as_float), bool_mask),
            "approx_kl": masked_mean(kl_estimate(old_logprobs.detach(), logprobs.detach(), "k3", bool_mask), bool_mask),
            "ratio_mean": masked_mean(r, bool_mask),
            "ratio_max": torch.where(any_token, r.masked_fill(~bool_mask, float("-inf")).max(), r.new_zeros(())),
            "ratio_min": torch.where(any_token, r.masked_fill(~bool_mask, float("inf")).min(), r.new_zeros(())),
        }
    return loss, stats


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.2,
    agg: AggregationMode = "token_mean",
    norm_constant: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value-function loss for PPO's critic.

    Per token ``0.5 * max((V - R)^2, (V_clip - R)^2)`` with
    ``V_clip = V_old + clip(V - V_old, -clip, clip)``: the critic may not move further than ``clip``
    from the values used to compute the advantages (PPO2 baselines implementation; discussed in
    Engstrom et al., "Implementation Matters in Deep Policy Gradients", 2020, arXiv:2005.12729).
    ``clip=None`` gives the plain ``0.5 * (V - R)^2``. Returns ``(loss, stats)`` with ``clip_ratio``,
    the fraction of real tokens where the clipped error was the larger one.
    """
    check_same_shape(mask, values=values, old_values=old_values, returns=returns)
    bool_mask = as_bool_mask(mask)
    zero = torch.zeros_like(values)
    v = torch.where(bool_mask, values, zero)
    v_old = torch.where(bool_mask, old_values.detach(), zero)
    target = torch.where(bool_mask, returns.detach(), zero)

    unclipped_error = (v - target).square()
    if clip is None:
        loss_tok = 0.5 * unclipped_error
        clipped_active = torch.zeros_like(bool_mask)
    else:
        v_clipped = v_old + (v - v_old).clamp(-clip, clip)
        clipped_error = (v_clipped - target).square()
        loss_tok = 0.5 * torch.maximum(unclipped_error, clipped_error)
        clipped_active = (clipped_error > unclipped_error) & bool_mask

    loss = aggregate(loss_tok, mask, agg, norm_constant)
    stats = {"clip_ratio": masked_mean(clipped_active.to(values.dtype), bool_mask).detach()}
    return loss, stats


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the next-token distribution at each position: ``[B, T, V] -> [B, T]``.

    ``H = logsumexp(z) - sum_v softmax(z)_v * z_v``, which avoids ``log(softmax)`` of tiny
    probabilities. Logits of ``-inf`` (banned tokens) contribute 0. Mask the result yourself
    (``masked_mean``) before reporting ``policy/entropy``.
    """
    log_normaliser = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    # Zero the logits of impossible tokens before multiplying: 0 * -inf would be NaN (also in backward).
    finite_logits = logits.masked_fill(probs == 0, 0.0)
    return log_normaliser - (probs * finite_logits).sum(dim=-1)
