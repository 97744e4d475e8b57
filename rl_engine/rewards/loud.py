"""A reward that fails is loud: a component that fails on more than its `max_error_rate` of a step's samples
(default 0.5) fails the run, with the first error it gave; fewer failures score 0 with their reasons, and the
platform raises a critical alert on any (`reward/errors`). The score stage calls `check_error_rates` on every
step's result."""

from __future__ import annotations

from collections.abc import Mapping

from rl_engine.rewards.base import TOTAL, RewardResult

DEFAULT_MAX_ERROR_RATE = 0.5


class RewardsFailed(RuntimeError):
    """A reward component failed on too many of a step's samples; the message names it and its first error."""


def check_error_rates(result: RewardResult, limits: Mapping[str, float]) -> None:
    """Raises RewardsFailed for the first component (in the run's order) whose share of failed samples is over
    its limit (`limits`: component name -> max_error_rate; a component not listed, and the weighted total's
    overflow, take the default)."""
    for name, reasons in result.component_errors.items():
        if not reasons:
            continue
        failed = [reason for reason in reasons if reason is not None]
        limit = limits.get(name, DEFAULT_MAX_ERROR_RATE)
        rate = len(failed) / len(reasons)
        if failed and rate > limit:
            what = "the weighted total" if name == TOTAL else f"reward {name!r}"
            raise RewardsFailed(
                f"{what} failed on {len(failed)} of {len(reasons)} samples of the step ({rate:.0%}, over its "
                f"max_error_rate of {limit:g}); the first error: {failed[0]}"
            )
