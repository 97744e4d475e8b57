"""Other engines' metric names as Posttrain's, so the run page's standard panels and diagnostics
(reward, KL, entropy, clip ratio, length, truncation, losses, timing) read them. Names without an
entry are kept as they are: nothing logged is dropped. The README's "Track a TRL / OpenRLHF / verl
run" section lists these maps."""

from __future__ import annotations

import re

TRL: dict[str, str] = {
    "reward": "reward/mean",
    "reward_std": "reward/std",
    "frac_reward_zero_std": "reward/group_all_equal_rate",
    "kl": "kl/mean",
    "entropy": "policy/entropy",
    "loss": "policy/loss",
    "grad_norm": "policy/grad_norm",
    "learning_rate": "policy/lr",
    "clip_ratio/region_mean": "policy/clip_ratio",
    "clip_ratio/low_mean": "policy/clip_ratio_low",
    "clip_ratio/high_mean": "policy/clip_ratio_high",
    "completions/mean_length": "response/length_mean",
    "completions/max_length": "response/length_max",
    "completions/min_length": "response/length_min",
    "completions/clipped_ratio": "response/truncated_rate",
    "num_tokens": "progress/tokens",
    "epoch": "progress/epoch",
    "step_time": "timing/step",
    "sampling/sampling_logp_difference/mean": "rollout/logprob_diff_mean",
    "sampling/sampling_logp_difference/max": "rollout/logprob_diff_max",
}
_TRL_REWARD_FUNC = re.compile(r"^rewards/(.+)/(mean|std)$")  # one per reward function

VERL: dict[str, str] = {
    "critic/score/mean": "reward/mean",  # the reward functions' score (critic/rewards adds the in-reward KL)
    "critic/score/max": "reward/max",
    "critic/score/min": "reward/min",
    "critic/advantages/mean": "advantages/mean",
    "critic/vf_loss": "critic/loss",
    "critic/vf_clipfrac": "critic/clip_ratio",
    "actor/pg_loss": "policy/loss",
    "actor/entropy": "policy/entropy",
    "actor/pg_clipfrac": "policy/clip_ratio",
    "actor/ppo_kl": "policy/approx_kl",
    "actor/kl_loss": "kl/mean",
    "actor/grad_norm": "policy/grad_norm",
    "actor/lr": "policy/lr",
    "response_length/mean": "response/length_mean",
    "response_length/max": "response/length_max",
    "response_length/min": "response/length_min",
    "response_length/clip_ratio": "response/truncated_rate",
    "timing_s/gen": "timing/generate",
    "timing_s/reward": "timing/reward",
    "timing_s/old_log_prob": "timing/forward",
    "timing_s/adv": "timing/advantages",
    "timing_s/update_actor": "timing/train",
    "timing_s/update_weights": "timing/weight_sync",
    "timing_s/step": "timing/step",
    "perf/throughput": "throughput/tokens_per_s",  # verl: tokens per second per GPU
    "training/epoch": "progress/epoch",
}
_VERL_VALIDATION = re.compile(r"^val-core/(.+)$")  # val-core/<data source>/<metric>@k -> eval/...

OPENRLHF: dict[str, str] = {  # its TensorBoard tags, after the `train/` prefix
    "reward": "reward/mean",
    "kl": "kl/mean",
    "policy_loss": "policy/loss",
    "critic_loss": "critic/loss",
    "actor_lr": "policy/lr",
    "critic_lr": "critic/lr",
    "response_length": "response/length_mean",
    "total_length": "sequence/length_mean",
    "return": "returns/mean",
    "values": "critic/values_mean",
    "policy_entropy": "policy/entropy",
    "entropy_loss": "policy/entropy",
    "ppo_clip_ratio": "policy/clip_ratio",
    "clip_ratio": "policy/clip_ratio",
    "actor_grad_norm": "policy/grad_norm",
}

ENGINES = ("trl", "verl", "openrlhf")


def trl_name(key: str) -> str:
    if key.startswith("eval_"):
        return f"eval/{trl_name(key[len('eval_') :])}"
    if key in TRL:
        return TRL[key]
    per_function = _TRL_REWARD_FUNC.match(key)
    if per_function:
        name, stat = per_function.groups()
        return f"reward/{name}" if stat == "mean" else f"reward/{name}/std"
    return key


def verl_name(key: str) -> str:
    if key in VERL:
        return VERL[key]
    validation = _VERL_VALIDATION.match(key)
    if validation:
        return f"eval/{validation.group(1)}"
    if key.startswith("timing_s/"):
        return f"timing/{key[len('timing_s/') :]}"
    return key


def openrlhf_name(key: str) -> str:
    """OpenRLHF's (and TRL's `report_to=tensorboard`) `train/<key>` tags; `eval/` stays."""
    if key.startswith("train/"):
        inner = key[len("train/") :]
        return OPENRLHF.get(inner) or TRL.get(inner) or trl_name(inner)
    return key


def tensorboard_name(key: str) -> str:
    """A TensorBoard tag from whichever engine wrote it: verl's logger writes its own names,
    OpenRLHF and TRL prefix theirs with `train/`."""
    mapped = verl_name(key)
    return mapped if mapped != key else openrlhf_name(key)


RENAMERS = {"trl": trl_name, "verl": verl_name, "openrlhf": openrlhf_name, "tensorboard": tensorboard_name}
