"""The RL math: advantage estimators, KL estimators, losses and batch filters.

Plain typed functions over torch tensors. Batches are right-padded ``[batch, response_len]`` over
response tokens only, with a ``mask`` (1 = real token); per-sequence quantities are ``[batch]``.
Every estimator returns per-token advantages ``[batch, response_len]``, 0 on padding.
"""

from .advantages import (
    GROUP_ESTIMATORS,
    discounted_returns,
    dr_grpo_advantages,
    gae,
    grpo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from .filters import dynamic_sampling_keep, overlong_penalty
from .kl import K3_LOG_RATIO_CLAMP, KLEstimator, kl_estimate, kl_penalized_rewards
from .losses import (
    AGGREGATION_MODES,
    LOG_RATIO_CLAMP,
    AggregationMode,
    aggregate,
    entropy_from_logits,
    policy_loss,
    value_loss,
)
from .masking import broadcast_to_tokens, masked_mean, masked_sum, masked_whiten, place_on_last_token

__all__ = [
    "AGGREGATION_MODES",
    "GROUP_ESTIMATORS",
    "K3_LOG_RATIO_CLAMP",
    "LOG_RATIO_CLAMP",
    "AggregationMode",
    "KLEstimator",
    "aggregate",
    "broadcast_to_tokens",
    "discounted_returns",
    "dr_grpo_advantages",
    "dynamic_sampling_keep",
    "entropy_from_logits",
    "gae",
    "grpo_advantages",
    "kl_estimate",
    "kl_penalized_rewards",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "overlong_penalty",
    "place_on_last_token",
    "policy_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "value_loss",
]
