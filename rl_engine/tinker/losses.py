"""The loss functions the Tinker API names, over one datum's per-token tensors.

Each takes the datum's ``target_logprobs`` ``[N]`` (the trained policy's log-probs of its target tokens,
differentiable) and its ``loss_fn_inputs`` (1-D tensors of length ``N``), and returns the datum's loss
as a **sum over its tokens**, as the hosted service defines them (its losses page): a batch's loss is
the sum over its datums, and the caller scales by the token count where it wants a mean.

* ``cross_entropy``: ``-(target_logprobs * weights).sum()`` (``weights`` default 1).
* ``importance_sampling``: ``-(r * A).sum()``, ``r = exp(target_logprobs - logprobs)`` where
  ``logprobs`` are the sampling policy's: REINFORCE with an importance weight, no clip.
* ``ppo``: ``-min(r * A, clip(r, lo, hi) * A).sum()`` (Schulman et al. 2017), per token.
* ``cispo``: ``-(sg(clip(r, lo, hi)) * target_logprobs * A).sum()`` (MiniMax-M1, arXiv:2506.13585):
  the weight is clipped, the gradient of every token kept.
* ``gspo``: GSPO-token (Zheng et al. 2025, arXiv:2507.18071): every token carries the sequence ratio
  ``s = exp(mean over the tokens ``sequence_ratio_mask`` marks of (target_logprobs - logprobs))`` as
  its value and its own log-prob's gradient; then PPO's clipped objective per token.
* ``dro``: ``-(target_logprobs * A - beta / 2 * (target_logprobs - logprobs) ** 2).sum()``: the
  policy-gradient term with a quadratic penalty on the log-ratio (Richemond et al. 2024,
  arXiv:2405.19107), ``beta`` from ``loss_fn_config`` (default 0.05).

``lo``/``hi`` (``clip_low_threshold``/``clip_high_threshold``) are absolute ratio bounds, 0.8 and 1.2
unless the datum's ``loss_fn_inputs`` (per token) or the call's ``loss_fn_config`` give them. Where a
datum carries ``weights`` with an RL loss, each token's term is multiplied by its weight (a datum
without them is unaffected). ``stable_reinforce`` and ``custom`` are refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["LOSS_REQUIREMENTS", "TINKER_LOSSES", "LossRefused", "datum_loss"]

DEFAULT_CLIP_LOW = 0.8
DEFAULT_CLIP_HIGH = 1.2
DEFAULT_DRO_BETA = 0.05
#: As the engine's losses: a log-ratio past this is clamped before ``exp`` (a large finite ratio, not inf).
LOG_RATIO_CLAMP = 20.0


class LossRefused(ValueError):
    """A loss or an input the service does not serve; the message names it."""


@dataclass(frozen=True)
class LossArgs:
    target_logprobs: Tensor
    inputs: Mapping[str, Tensor]
    config: Mapping[str, float | str]

    def tensor(self, name: str, default: float | None = None) -> Tensor:
        value = self.inputs.get(name)
        if value is not None:
            return value.to(self.target_logprobs.dtype)
        if default is None:
            raise LossRefused(f"loss_fn_inputs: {name!r} is required")
        return torch.full_like(self.target_logprobs, default).detach()

    def bound(self, name: str, default: float) -> Tensor:
        configured = self.config.get(name, default)
        if isinstance(configured, str):
            raise LossRefused(f"loss_fn_config: {name!r} must be a number, got {configured!r}")
        return self.tensor(name, float(configured))

    def ratio_log(self) -> Tensor:
        return (self.target_logprobs - self.tensor("logprobs")).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)

    def weighted(self, per_token: Tensor) -> Tensor:
        weights = self.inputs.get("weights")
        return per_token if weights is None else per_token * weights.to(per_token.dtype)


def _cross_entropy(args: LossArgs) -> Tensor:
    return -(args.target_logprobs * args.tensor("weights", 1.0)).sum()


def _importance_sampling(args: LossArgs) -> Tensor:
    ratio = torch.exp(args.ratio_log())
    return args.weighted(-(ratio * args.tensor("advantages"))).sum()


def _clipped_objective(ratio: Tensor, args: LossArgs) -> Tensor:
    advantages = args.tensor("advantages")
    low, high = args.bound("clip_low_threshold", DEFAULT_CLIP_LOW), args.bound("clip_high_threshold", DEFAULT_CLIP_HIGH)
    clipped = torch.minimum(torch.maximum(ratio, low), high)
    return torch.minimum(ratio * advantages, clipped * advantages)


def _ppo(args: LossArgs) -> Tensor:
    return args.weighted(-_clipped_objective(torch.exp(args.ratio_log()), args)).sum()


def _cispo(args: LossArgs) -> Tensor:
    low, high = args.bound("clip_low_threshold", DEFAULT_CLIP_LOW), args.bound("clip_high_threshold", DEFAULT_CLIP_HIGH)
    weight = torch.minimum(torch.maximum(torch.exp(args.ratio_log()).detach(), low), high)
    return args.weighted(-(weight * args.target_logprobs * args.tensor("advantages"))).sum()


def _gspo(args: LossArgs) -> Tensor:
    in_ratio = args.tensor("sequence_ratio_mask", 1.0) != 0
    if not bool(in_ratio.any()):
        raise LossRefused("loss_fn_inputs: 'sequence_ratio_mask' marks no token")
    detached = args.target_logprobs.detach()
    sequence_log_ratio = (detached - args.tensor("logprobs"))[in_ratio].mean().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(sequence_log_ratio + args.target_logprobs - detached)
    return args.weighted(-_clipped_objective(ratio, args)).sum()


def _dro(args: LossArgs) -> Tensor:
    beta = args.config.get("beta", DEFAULT_DRO_BETA)
    if isinstance(beta, str):
        raise LossRefused(f"loss_fn_config: 'beta' must be a number, got {beta!r}")
    log_ratio = args.target_logprobs - args.tensor("logprobs")
    objective = args.target_logprobs * args.tensor("advantages") - 0.5 * float(beta) * log_ratio**2
    return args.weighted(-objective).sum()


TINKER_LOSSES: dict[str, Callable[[LossArgs], Tensor]] = {
    "cross_entropy": _cross_entropy,
    "importance_sampling": _importance_sampling,
    "ppo": _ppo,
    "cispo": _cispo,
    "gspo": _gspo,
    "dro": _dro,
}

#: The inputs each loss cannot do without (besides ``target_tokens``), checked before any compute.
LOSS_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": (),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
    "gspo": ("logprobs", "advantages"),
    "dro": ("logprobs", "advantages"),
}


def check_loss_name(name: str) -> None:
    if name not in TINKER_LOSSES:
        served = ", ".join(TINKER_LOSSES)
        raise LossRefused(f"loss_fn {name!r} is not served here; use one of: {served}")


def datum_loss(
    name: str, target_logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float | str] | None = None
) -> Tensor:
    """The datum's loss (a scalar, a sum over its tokens) under the Tinker loss ``name``."""
    check_loss_name(name)
    return TINKER_LOSSES[name](LossArgs(target_logprobs, inputs, config or {}))
