"""Masked reductions shared by the estimators and the losses.

Every batch tensor in ``rl_engine.algorithms`` is right-padded ``[batch, response_len]`` over
response tokens only, with a ``mask`` (bool or float, 1 = real token). The helpers here select
with ``torch.where`` instead of multiplying by the mask, so that a NaN or inf sitting in a padded
slot cannot leak into a result (``0 * inf`` is NaN).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "as_bool_mask",
    "broadcast_to_tokens",
    "check_same_shape",
    "masked_center",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "place_on_last_token",
]


def check_same_shape(mask: Tensor, **tensors: Tensor) -> None:
    """Raise ``ValueError`` unless every named tensor has the shape of ``mask`` (2-D)."""
    if mask.dim() != 2:
        raise ValueError(f"mask must be 2-D [batch, response_len], got shape {tuple(mask.shape)}")
    for name, tensor in tensors.items():
        if tensor.shape != mask.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(mask.shape)} like mask")


def as_bool_mask(mask: Tensor) -> Tensor:
    """Return ``mask`` as a bool tensor (any non-zero entry is a real token)."""
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over real tokens (padding ignored, even if it holds NaN)."""
    selected = torch.where(as_bool_mask(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over real tokens; 0 where there are none (instead of NaN).

    With ``dim=None`` every real token of the batch weighs the same; with ``dim=-1`` one mean per row.
    """
    count = as_bool_mask(mask).sum() if dim is None else as_bool_mask(mask).sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_whiten(
    x: Tensor,
    mask: Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    unbiased: bool = False,
) -> Tensor:
    """Normalise ``x`` to zero mean and unit variance over all real tokens of the batch.

    Statistics are global (one mean, one std for the whole batch), so each token weighs the same and
    longer responses weigh more: that is the "global batch normalisation" of REINFORCE++ (Hu, 2025).
    The variance is the population one (``unbiased=False``) by default; with thousands of tokens the
    Bessel correction makes no practical difference. ``shift_mean=False`` only rescales, keeping the
    original mean. Padding is 0 in the result.
    """
    bool_mask = as_bool_mask(mask)
    count = bool_mask.sum().to(x.dtype)
    mean = masked_sum(x, bool_mask) / count.clamp(min=1)
    centred = torch.where(bool_mask, x - mean, torch.zeros((), dtype=x.dtype, device=x.device))
    denominator = (count - 1).clamp(min=1) if unbiased else count.clamp(min=1)
    variance = (centred**2).sum() / denominator
    whitened = centred * torch.rsqrt(variance + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(bool_mask, whitened, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_center(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` minus its mean over all real tokens of the batch (no scaling); padding is 0."""
    bool_mask = as_bool_mask(mask)
    mean = masked_sum(x, bool_mask) / bool_mask.sum().clamp(min=1).to(x.dtype)
    return torch.where(bool_mask, x - mean, torch.zeros((), dtype=x.dtype, device=x.device))


def broadcast_to_tokens(per_sequence: Tensor, mask: Tensor) -> Tensor:
    """Spread one value per sequence ``[B]`` over that row's real tokens ``[B, T]``; padding is 0."""
    if per_sequence.dim() != 1 or per_sequence.shape[0] != mask.shape[0]:
        raise ValueError(f"expected one value per sequence, shape ({mask.shape[0]},), got {tuple(per_sequence.shape)}")
    return torch.where(
        as_bool_mask(mask),
        per_sequence.unsqueeze(-1),
        torch.zeros((), dtype=per_sequence.dtype, device=per_sequence.device),
    )


def place_on_last_token(per_sequence: Tensor, mask: Tensor) -> Tensor:
    """Put one value per sequence ``[B]`` on that row's last real token, 0 elsewhere ``[B, T]``.

    A row with no real token gets nothing (its value is dropped rather than written into padding).
    """
    if per_sequence.dim() != 1 or per_sequence.shape[0] != mask.shape[0]:
        raise ValueError(f"expected one value per sequence, shape ({mask.shape[0]},), got {tuple(per_sequence.shape)}")
    bool_mask = as_bool_mask(mask)
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    # Highest position holding a real token; robust even if the mask is not strictly right-padded.
    last_index = (bool_mask * positions).argmax(dim=-1)
    has_token = bool_mask.any(dim=-1)
    out = torch.zeros(mask.shape, dtype=per_sequence.dtype, device=per_sequence.device)
    values = torch.where(has_token, per_sequence, torch.zeros_like(per_sequence))
    return out.scatter(1, last_index.unsqueeze(-1), values.unsqueeze(-1))
