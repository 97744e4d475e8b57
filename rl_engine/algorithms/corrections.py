"""Rollout correction: importance weights between the policy being trained and the one that sampled.

The rollout engine (vLLM in bf16, a stale copy, top-k/top-p sampling) does not sample from exactly the
policy the trainer computes; the update then is off-policy and, left alone, can collapse. With
``log rho_t = log pi_proximal(y_t) - log pi_behaviour(y_t)`` (the trainer's log-prob of the sampled
token before the update, minus the rollout engine's), the methods registered here turn ``rho`` into
per-token weights ``w [B, T]`` that multiply the policy loss (0 drops a token; see
:func:`rl_engine.algorithms.losses.policy_loss`), ``low``/``high`` being the thresholds:

* ``token_tis``: ``w_t = clip(rho_t, low, high)`` — truncated IS (Ionides 2008; for LLM RL: Yao et al.
  2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", C = 2);
* ``sequence_tis``: ``w = clip(prod_t rho_t, low, high)`` on every token of the sequence;
* ``token_mis`` / ``sequence_mis``: ``w = rho`` inside ``[low, high]``, 0 outside — masked IS (Liu et
  al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
  Mismatch");
* ``icepop``: token MIS on IcePop's two-sided interval ``[0.5, 5]`` (Ling Team 2025, Ring-1T,
  arXiv:2510.18855);
* ``geo_mask``: keep a sequence (``w = 1``) when its geometric-mean ratio ``exp(mean_t log rho_t)`` is
  in ``[low, high]``, drop it (``w = 0``) otherwise — length-normalised, so long sequences are not
  dropped for the product of many tiny gaps (Liu et al. 2025);
* ``metrics``: ``w = 1`` (the loss is unchanged), only the diagnostics; ``none``: nothing at all.

``rho`` is always taken against the *proximal* policy (the one the update starts from, the PPO ratio's
denominator), never against the policy being trained, and the weights are detached: they change the
measure, not the objective. Every method's log-ratio is clamped to +-20 before ``exp``.

Diagnostics (logged every step a method other than ``none`` runs, over real tokens), with
``rho_t`` as above:

* ``rollout_corr/kl`` — ``mean_t (log pi_behaviour - log pi_proximal)``, the k1 estimate of
  KL(behaviour || proximal) on the behaviour's own samples; ``rollout_corr/k3_kl`` —
  ``mean_t (rho - 1 - log rho)``, never negative;
* ``rollout_corr/log_ppl_abs_diff`` — ``mean_i |mean_t log pi_behaviour - mean_t log pi_proximal|``,
  the per-sequence gap in log-perplexity;
* ``rollout_corr/chi2_token`` — ``mean_t rho_t^2 - 1``; ``rollout_corr/chi2_seq`` —
  ``mean_i (prod_t rho_t)^2 - 1``: the chi-square divergences that bound the variance of token- and
  sequence-level importance weights;
* ``rollout_corr/weight_{min,p05,p50,p95,max}`` — quantiles of the token ratio ``rho_t`` (what
  untruncated token IS would weigh by), ``rollout_corr/weight_mean`` — of the weights applied;
* ``rollout_corr/masked_fraction`` / ``truncated_fraction`` — of real tokens a method dropped / whose
  weight it truncated; ``rollout_corr/seq_masked_fraction`` — of sequences with any dropped token;
* with the samples' policy versions, ``rollout_corr/staleness_{mean,max}`` — trainer version minus the
  version that sampled each row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from . import catalogue
from .masking import as_bool_mask, check_same_shape, masked_mean, masked_sum
from .registry import ROLLOUT_CORRECTIONS

__all__ = ["CorrectionInputs", "CorrectionResult", "CorrectionTerms", "rollout_correction"]

#: ``exp(+-20)`` keeps every weight and chi-square term finite (e^40 ~ 2e17 for a squared sequence ratio).
LOG_RATIO_CLAMP = 20.0
_QUANTILES = (0.05, 0.5, 0.95)


@dataclass(frozen=True)
class CorrectionInputs:
    """The correction's view of a batch: three policies' log-probs of the same sampled tokens.

    ``behaviour_logprobs`` come from whatever sampled each row (the rollout engine, possibly several
    updates behind: each row its own); ``proximal_logprobs`` from the trainer, under the weights the
    update starts from. ``policy_versions``, when known, is the weight version each row was sampled
    with, and ``trainer_version`` the version being trained (for the staleness metrics)."""

    behaviour_logprobs: Tensor  # [B, T]
    proximal_logprobs: Tensor  # [B, T]
    mask: Tensor  # [B, T] real (action) tokens
    policy_versions: Tensor | None = None  # [B], or [B, T] when a row's tokens were sampled under several
    trainer_version: int | None = None


@dataclass(frozen=True)
class CorrectionTerms:
    """What a method returns: the weights and where it dropped or truncated."""

    weights: Tensor | None  # [B, T]; None = the loss is left as it is
    masked: Tensor  # [B, T] bool
    truncated: Tensor  # [B, T] bool


@dataclass(frozen=True)
class CorrectionResult:
    weights: Tensor | None  # [B, T] detached, 0 on padding; None = leave the loss unchanged
    metrics: dict[str, float]


def rollout_correction(
    method: str, inputs: CorrectionInputs, low: float | None = None, high: float | None = None
) -> CorrectionResult:
    """Weights (``None`` for ``none``/``metrics``) and the ``rollout_corr/*`` metrics of ``method``, with the
    catalogue's thresholds where ``low``/``high`` are None."""
    correct = ROLLOUT_CORRECTIONS.get(method)  # an unknown name fails here, naming the choices
    spec = catalogue.CORRECTIONS[method]
    if not spec.needs:
        return CorrectionResult(None, {})
    mask = as_bool_mask(inputs.mask)
    check_same_shape(mask, behaviour_logprobs=inputs.behaviour_logprobs, proximal_logprobs=inputs.proximal_logprobs)
    low = spec.low if low is None else low
    high = spec.high if high is None else high
    if low is not None and high is not None and low >= high:
        raise ValueError(f"rollout correction {method!r}: low ({low}) must be below high ({high})")

    zeros = torch.zeros_like(inputs.proximal_logprobs)
    log_ratio = torch.where(mask, inputs.proximal_logprobs - inputs.behaviour_logprobs, zeros).detach()
    terms = correct(log_ratio, mask, low, high)
    weights = None if terms.weights is None else torch.where(mask, terms.weights, zeros).detach()
    metrics = mismatch_metrics(inputs, log_ratio, mask)
    applied = weights if weights is not None else mask.to(log_ratio.dtype)
    metrics.update(
        {
            "rollout_corr/weight_mean": float(masked_mean(applied, mask)),
            "rollout_corr/masked_fraction": _fraction(terms.masked & mask, mask),
            "rollout_corr/truncated_fraction": _fraction(terms.truncated & mask, mask),
            "rollout_corr/seq_masked_fraction": float((terms.masked & mask).any(dim=-1).float().mean()),
        }
    )
    return CorrectionResult(weights, metrics)


def mismatch_metrics(inputs: CorrectionInputs, log_ratio: Tensor, mask: Tensor) -> dict[str, float]:
    """The method-independent diagnostics (see the module docstring); ``log_ratio`` is 0 on padding."""
    behaviour = torch.where(mask, inputs.behaviour_logprobs, torch.zeros_like(log_ratio))
    proximal = torch.where(mask, inputs.proximal_logprobs, torch.zeros_like(log_ratio))
    clamped = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho = torch.exp(clamped)
    rows = mask.any(dim=-1)
    log_ppl_gap = masked_mean(behaviour, mask, dim=-1) - masked_mean(proximal, mask, dim=-1)
    sequence_log_ratio = masked_sum(log_ratio, mask, dim=-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    token_ratios = rho[mask]
    metrics = {
        "rollout_corr/kl": float(masked_mean(-log_ratio, mask)),
        "rollout_corr/k3_kl": float(masked_mean(rho - 1.0 - clamped, mask)),
        "rollout_corr/log_ppl_abs_diff": float(log_ppl_gap[rows].abs().mean()) if rows.any() else 0.0,
        "rollout_corr/chi2_token": float(masked_mean(rho.square(), mask)) - 1.0,
        "rollout_corr/chi2_seq": float(torch.exp(2.0 * sequence_log_ratio[rows]).mean()) - 1.0 if rows.any() else 0.0,
    }
    if token_ratios.numel():
        quantiles = torch.quantile(token_ratios.double(), torch.tensor(_QUANTILES, dtype=torch.float64))
        metrics.update(
            {
                "rollout_corr/weight_min": float(token_ratios.min()),
                "rollout_corr/weight_p05": float(quantiles[0]),
                "rollout_corr/weight_p50": float(quantiles[1]),
                "rollout_corr/weight_p95": float(quantiles[2]),
                "rollout_corr/weight_max": float(token_ratios.max()),
            }
        )
    if inputs.policy_versions is not None and inputs.trainer_version is not None:
        staleness = (inputs.trainer_version - inputs.policy_versions).to(log_ratio.dtype)
        # One version per row, or per token (a partial rollout resumed under newer weights).
        real = mask if staleness.dim() == 2 else torch.ones_like(staleness, dtype=torch.bool)
        metrics["rollout_corr/staleness_mean"] = float(staleness[real].mean()) if real.any() else 0.0
        metrics["rollout_corr/staleness_max"] = float(staleness[real].max()) if real.any() else 0.0
    return metrics


def _fraction(selected: Tensor, mask: Tensor) -> float:
    return float(selected.sum()) / max(int(mask.sum()), 1)


def _bounds(low: float | None, high: float | None) -> tuple[float, float]:
    return (0.0 if low is None else low), (math.inf if high is None else high)


def _sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """``sum_t log rho_t`` per row, clamped, broadcast back to ``[B, T]``."""
    return (
        masked_sum(log_ratio, mask, dim=-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).unsqueeze(-1).expand_as(log_ratio)
    )


def _truncate(log_ratio: Tensor, mask: Tensor, low: float | None, high: float | None) -> CorrectionTerms:
    lo, hi = _bounds(low, high)
    rho = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return CorrectionTerms(rho.clamp(lo, hi), torch.zeros_like(mask), (rho < lo) | (rho > hi))


def _mask_outside(log_ratio: Tensor, mask: Tensor, low: float | None, high: float | None) -> CorrectionTerms:
    lo, hi = _bounds(low, high)
    rho = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    outside = (rho < lo) | (rho > hi)
    return CorrectionTerms(torch.where(outside, torch.zeros_like(rho), rho), outside, torch.zeros_like(mask))


@ROLLOUT_CORRECTIONS.register("none")
@ROLLOUT_CORRECTIONS.register("metrics")
def _leave_the_loss(log_ratio: Tensor, mask: Tensor, low: float | None, high: float | None) -> CorrectionTerms:
    nothing = torch.zeros_like(mask)
    return CorrectionTerms(None, nothing, nothing)


@ROLLOUT_CORRECTIONS.register("token_tis")
def _token_tis(log_ratio: Tensor, mask: Tensor, low: float | None, high: float | None) -> CorrectionTerms:
    return _truncate(log_ratio, mask, low, high)


@ROLLOUT_CORRECTIONS.register("sequence_tis")
def _sequence_tis(log_ratio: Tensor, mask: Tensor, low: float | None, high: float | None) -> CorrectionTerms:
    return _truncate(_sequence_log_ratio(log_ratio, mask), mask, low, high)


@ROLLOUT_CORRECTIONS.register("token_mis")
@ROLLOUT_CORRECTIONS.register("icepop")  # the same rule; its thresholds differ (catalogue)
def _token_mis(log_ratio: Tensor, mask: Tensor, low: float | None, high: float | None) -> CorrectionTerms:
    return _mask_outside(log_ratio, mask, low, high)


@ROLLOUT_CORRECTIONS.register("sequence_mis")
def _sequence_mis(log_ratio: Tensor, mask: Tensor, low: float | None, high: float | None) -> CorrectionTerms:
    return _mask_outside(_sequence_log_ratio(log_ratio, mask), mask, low, high)


@ROLLOUT_CORRECTIONS.register("geo_mask")
def _geo_mask(log_ratio: Tensor, mask: Tensor, low: float | None, high: float | None) -> CorrectionTerms:
    lo, hi = _bounds(low, high)
    geometric = torch.exp(masked_mean(log_ratio, mask, dim=-1)).unsqueeze(-1).expand_as(log_ratio)
    outside = (geometric < lo) | (geometric > hi)
    return CorrectionTerms(torch.where(outside, 0.0, 1.0).to(log_ratio.dtype), outside, torch.zeros_like(mask))
