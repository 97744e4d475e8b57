"""The RL math: advantage estimators, policy losses, rollout corrections, KL estimators, batch filters.

Plain typed functions over torch tensors. Batches are right-padded ``[batch, response_len]`` over
response tokens only, with a ``mask`` (1 = real token); per-sequence quantities are ``[batch]``.
Every estimator returns per-token advantages ``[batch, response_len]``, 0 on padding.

Where things are: ``catalogue.py`` every algorithm's name and traits (torch-free: the run config's
schema is built from it); ``registry.py`` the functions behind those names; ``advantages.py`` the
estimators; ``policy_losses/`` one file per policy loss; ``losses.py`` what the policy losses share,
the value loss and aggregation; ``corrections.py`` the rollout correction; ``kl.py``, ``masking.py``,
``filters.py``. Names import lazily from here, so the torch-free modules load without torch.
"""

from __future__ import annotations

from rl_engine.lazy import lazy_exports

_EXPORTS = {
    "AdvantageInputs": "advantages",
    "discounted_returns": "advantages",
    "dr_grpo_advantages": "advantages",
    "gae": "advantages",
    "grpo_advantages": "advantages",
    "reinforce_pp_advantages": "advantages",
    "reinforce_pp_baseline_advantages": "advantages",
    "rloo_advantages": "advantages",
    "CorrectionInputs": "corrections",
    "CorrectionResult": "corrections",
    "rollout_correction": "corrections",
    "drop_flagged": "filters",
    "dynamic_sampling_keep": "filters",
    "overlong_penalty": "filters",
    "K3_LOG_RATIO_CLAMP": "kl",
    "KLEstimator": "kl",
    "kl_estimate": "kl",
    "kl_penalized_rewards": "kl",
    "AGGREGATION_MODES": "losses",
    "LOG_RATIO_CLAMP": "losses",
    "AggregationMode": "losses",
    "aggregate": "losses",
    "entropy_from_logits": "losses",
    "policy_loss": "losses",
    "value_loss": "losses",
    "broadcast_to_tokens": "masking",
    "masked_center": "masking",
    "masked_mean": "masking",
    "masked_sum": "masking",
    "masked_whiten": "masking",
    "place_on_last_token": "masking",
    "ADVANTAGE_ESTIMATORS": "registry",
    "POLICY_LOSS_FUNCTIONS": "registry",
    "ROLLOUT_CORRECTIONS": "registry",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
