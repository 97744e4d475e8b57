"""Batch filters and reward shaping from DAPO, and the drop of flagged samples the rollout filters use.

Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (2025,
arXiv:2503.14476).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["drop_flagged", "dynamic_sampling_keep", "overlong_penalty"]


def dynamic_sampling_keep(rewards: Tensor, group_size: int, atol: float = 1e-6) -> Tensor:
    """Which prompt groups carry a learning signal: ``BoolTensor[num_groups]``.

    DAPO's dynamic sampling (Yu et al. 2025, section 3.2): when every sample of a prompt gets the same
    reward (all solved or all failed), every group-relative advantage is 0 and the group only dilutes
    the batch, so it is dropped and more prompts are sampled. A group is kept when
    ``max - min > atol`` (the tolerance absorbs float noise from continuous reward models).
    Samples of one prompt are contiguous rows (rows ``0..g-1`` are group 0).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [batch], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.shape[0] % group_size != 0:
        raise ValueError(f"batch size {rewards.shape[0]} is not a positive multiple of group_size {group_size}")
    grouped = rewards.detach().view(-1, group_size)
    spread = grouped.max(dim=1).values - grouped.min(dim=1).values
    return spread > atol


def drop_flagged(keep: Tensor, flagged: Tensor, group_size: int | None) -> Tensor:
    """``keep [B]`` with the flagged rows dropped, each with its whole group when ``group_size`` is given.

    A group estimator's baseline is its group's mean: a sample cannot leave its group without changing
    the others' advantages, and the estimators take whole groups, so under one (``group_size``) a flagged
    sample drops its group; otherwise (ppo, reinforce_pp: baselines over the batch) only its own row.
    Samples of one prompt are contiguous rows.
    """
    if keep.shape != flagged.shape or keep.dim() != 1:
        raise ValueError(f"keep and flagged must both be [batch], got {tuple(keep.shape)} and {tuple(flagged.shape)}")
    flagged = flagged.bool()
    if group_size is not None:
        if group_size < 1 or flagged.shape[0] % group_size != 0:
            raise ValueError(f"batch size {flagged.shape[0]} is not a positive multiple of group_size {group_size}")
        flagged = flagged.view(-1, group_size).any(dim=1).repeat_interleave(group_size)
    return keep.bool() & ~flagged


def overlong_penalty(
    lengths: Tensor,
    max_len: int,
    buffer_len: int,
    penalty_factor: float = 1.0,
) -> Tensor:
    """DAPO soft overlong punishment, a reward term ``[B]`` to add to the task reward.

    Yu et al. 2025, section 3.4, eq. 13. With ``start = max_len - buffer_len``:
    0 for ``length <= start``; ``(start - length) / buffer_len * penalty_factor`` in the buffer
    ``start < length <= max_len`` (linear from 0 down to ``-penalty_factor``); ``-penalty_factor``
    beyond ``max_len``. ``buffer_len = 0`` degrades to a hard step at ``max_len``.
    """
    if buffer_len < 0 or buffer_len > max_len:
        raise ValueError(f"buffer_len must be in [0, max_len={max_len}], got {buffer_len}")
    length = lengths.to(torch.get_default_dtype()) if not lengths.is_floating_point() else lengths
    start = max_len - buffer_len
    ramp = (start - length) / buffer_len * penalty_factor if buffer_len > 0 else torch.zeros_like(length)
    penalty = torch.where(length <= start, torch.zeros_like(length), ramp)
    return torch.where(length > max_len, torch.full_like(length, -penalty_factor), penalty)
