"""Rules that span sections of the run config, and what this engine build can run.

Each error names the field the user should change. `cross_field_errors` runs inside `RunConfig`'s
validation; `unsupported_errors` / `check_runnable` refuse combinations that validate but that this
engine cannot run, and response lengths beyond the model's context (read from its config.json); the
platform calls it at launch, so they never become failed runs later.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_engine.algorithms.catalogue import ESTIMATORS, POLICY_LOSSES
from rl_engine.config.errors import ConfigError

if TYPE_CHECKING:
    from rl_engine.config.schema import AlgorithmConfig, RunConfig

# Estimators whose advantage compares the samples of one prompt with each other.
GROUP_ESTIMATORS = frozenset(name for name, spec in ESTIMATORS.items() if spec.level == "group")
# Estimators with token-level returns, the only ones that can take the KL penalty in the reward.
TOKEN_RETURN_ESTIMATORS = frozenset(name for name, spec in ESTIMATORS.items() if "reward" in spec.kl_placements)
DUAL_CLIP_LOSSES = tuple(name for name, spec in POLICY_LOSSES.items() if spec.dual_clip)


def cross_field_errors(c: RunConfig) -> list[tuple[str, str]]:
    """Rules spanning sections. Each error names the field the user should change."""
    return [*_reward_errors(c), *_algorithm_errors(c), *_batch_errors(c), *_backend_errors(c), *_device_errors(c)]


def _reward_errors(c: RunConfig) -> list[tuple[str, str]]:
    errors: list[tuple[str, str]] = []
    if not c.rewards and c.environment is None and c.agent is None:
        errors.append(
            ("rewards", "at least one reward component is needed (or an environment or agent that gives rewards)")
        )
    if c.environment is not None and c.agent is not None:
        errors.append(("agent", "a run has one executor: an environment or an agent, not both"))
    seen: set[str] = set()
    for i, r in enumerate(c.rewards):
        if r.name == "environment" and (c.environment is not None or c.agent is not None):
            errors.append((f"rewards.{i}.name", "'environment' is the environment's own component; rename this one"))
        if r.name in seen:
            errors.append((f"rewards.{i}.name", f"duplicate reward name {r.name!r}; give each component its own name"))
        seen.add(r.name)
    return errors


def _algorithm_errors(c: RunConfig) -> list[tuple[str, str]]:
    errors: list[tuple[str, str]] = []
    alg, ro = c.algorithm, c.rollout
    if alg.is_group_estimator and ro.samples_per_prompt < 2:
        errors.append(
            ("rollout.samples_per_prompt", f"group estimator {alg.name!r} needs more than one sample per prompt")
        )
    if alg.dynamic_sampling and ro.samples_per_prompt < 2:
        errors.append(
            ("algorithm.dynamic_sampling", "dynamic sampling filters prompt groups; it needs samples_per_prompt > 1")
        )
    if ro.filters.zero_advantage and not alg.estimator.zero_advantage_on_ties:
        tied = ", ".join(sorted(name for name, spec in ESTIMATORS.items() if spec.zero_advantage_on_ties))
        errors.append(
            (
                "rollout.filters.zero_advantage",
                f"{alg.name!r} gives no group exactly zero advantage (only {tied} do); leave it empty or false",
            )
        )
    if alg.kl.placement not in alg.estimator.kl_placements:
        token_level = ", ".join(sorted(TOKEN_RETURN_ESTIMATORS))
        errors.append(
            (
                "algorithm.kl.placement",
                f"KL in the reward needs token-level returns ({token_level}), not {alg.name!r}; use 'loss'",
            )
        )
    if alg.dual_clip is not None and not alg.loss.dual_clip:
        errors.append(
            (
                "algorithm.dual_clip",
                f"policy loss {alg.policy_loss!r} has no dual clip (only {', '.join(DUAL_CLIP_LOSSES)}); leave it empty",
            )
        )
    errors.extend(_ratio_against_errors(alg))
    if alg.needs_critic and alg.value_coef <= 0:
        errors.append(("algorithm.value_coef", "ppo trains a critic; value_coef must be > 0"))
    if alg.overlong.enabled and alg.overlong.buffer_tokens >= ro.max_new_tokens:
        errors.append(
            (
                "algorithm.overlong.buffer_tokens",
                f"must be smaller than rollout.max_new_tokens ({ro.max_new_tokens}), or every response is penalised",
            )
        )
    return errors


def _ratio_against_errors(alg: AlgorithmConfig) -> list[tuple[str, str]]:
    """A ratio against the behaviour log-probs must not double an importance weight the loss already applies."""
    errors: list[tuple[str, str]] = []
    if alg.ratio_against != "behaviour":
        return errors
    if alg.loss.behaviour_weighted:
        errors.append(
            (
                "algorithm.ratio_against",
                f"policy loss {alg.policy_loss!r} takes the ratio against the trainer's log-probs and weighs by "
                "proximal / behaviour itself; use 'proximal' (or 'auto')",
            )
        )
    elif alg.rollout_correction.spec.changes_loss:
        errors.append(
            (
                "algorithm.ratio_against",
                f"a ratio against the rollout engine's log-probs already holds the importance weight that "
                f"rollout correction {alg.rollout_correction.method!r} applies: it would count twice; use "
                "'proximal', or set algorithm.rollout_correction.method to 'metrics' or 'none'",
            )
        )
    return errors


def _batch_errors(c: RunConfig) -> list[tuple[str, str]]:
    """The step's samples split into whole mini-batches, of whole prompt groups, of whole micro-batches."""
    errors: list[tuple[str, str]] = []
    ro, tr, n = c.rollout, c.train, c.samples_per_step
    if tr.mini_batch_size is not None:
        mb = tr.mini_batch_size
        if n % mb:
            errors.append(
                (
                    "train.mini_batch_size",
                    f"must divide the samples per step ({ro.prompts_per_step} x {ro.samples_per_prompt} = {n})",
                )
            )
        if mb % ro.samples_per_prompt:
            errors.append(
                (
                    "train.mini_batch_size",
                    f"must be a multiple of rollout.samples_per_prompt ({ro.samples_per_prompt}) so groups stay whole",
                )
            )
        if mb % tr.micro_batch_size:
            errors.append(("train.micro_batch_size", f"must divide train.mini_batch_size ({mb})"))
    elif n % tr.micro_batch_size:
        errors.append(
            (
                "train.micro_batch_size",
                f"must divide the samples per step ({ro.prompts_per_step} x {ro.samples_per_prompt} = {n})",
            )
        )
    return errors


def _backend_errors(c: RunConfig) -> list[tuple[str, str]]:
    errors: list[tuple[str, str]] = []
    be = c.backends
    if be.zero_stage > 0 and be.training != "deepspeed":
        errors.append(("backends.zero_stage", "ZeRO stages above 0 need backends.training = 'deepspeed'"))
    if be.offload and (be.training != "deepspeed" or be.zero_stage == 0):
        errors.append(("backends.offload", "CPU offload needs backends.training = 'deepspeed' and zero_stage >= 1"))
    return errors


def _device_errors(c: RunConfig) -> list[tuple[str, str]]:
    """`device: cuda` needs a GPU reserved for the roles that use it: Ray gives a role's process only the
    GPUs of its bundle (the one-process engine: the job's, `max(gpus_per_trainer, gpus_per_rollout_engine)`)."""
    pl = c.placement
    if pl.device != "cuda":
        return []
    if pl.mode == "colocate":
        if max(pl.gpus_per_trainer, pl.gpus_per_rollout_engine) <= 0:
            return [("placement.gpus_per_trainer", "device 'cuda' needs a GPU reserved: set it to 1 (or a share)")]
        return []
    errors = []
    if pl.gpus_per_trainer <= 0:
        errors.append(("placement.gpus_per_trainer", "device 'cuda' needs a GPU per trainer rank: set it to 1"))
    if pl.gpus_per_rollout_engine <= 0:
        errors.append(
            ("placement.gpus_per_rollout_engine", "device 'cuda' needs a GPU per rollout engine: set it to 1")
        )
    return errors


# --------------------------------------------------------------------------------------------
# What this engine build can run
# --------------------------------------------------------------------------------------------


def unsupported_errors(cfg: RunConfig) -> list[dict[str, str]]:
    """`{"loc", "msg"}` for each option combination `cfg` sets that the engine cannot run ([] = runnable)."""
    be, pl = cfg.backends, cfg.placement
    checks = [
        # Measured: fp16 fails inside DeepSpeed at ZeRO 0 and 3 on CPU (and pure fp16 AdamW gives NaN).
        (
            "model.dtype",
            be.training == "deepspeed" and cfg.model.dtype == "float16",
            "float16 is not available with the DeepSpeed backend; use 'bfloat16' or 'float32'",
        ),
        # Colocated roles take turns on the same resources: there is nothing to overlap generation with.
        (
            "backends.async_rollout",
            be.async_rollout and pl.mode != "separate",
            "async rollout needs placement.mode 'separate' (colocated roles take turns on the same resources)",
        ),
        (
            "backends.async_rollout",
            be.async_rollout and (cfg.environment is not None or cfg.agent is not None),
            "async rollout runs single-turn generation only; environments and agents run synchronously",
        ),
        (
            "backends.max_staleness",
            be.max_staleness > 1 and not be.async_rollout,
            "generation runs ahead of training only in async mode: set backends.async_rollout, or leave this at 1",
        ),
        (
            "backends.partial_rollout",
            be.partial_rollout and not be.async_rollout,
            "partial rollout interrupts generation that runs during training: it needs backends.async_rollout",
        ),
        # vLLM generates a batch in one call that a weight load cannot enter (nor a staged one wait for).
        (
            "backends.partial_rollout",
            be.partial_rollout and be.rollout == "vllm",
            "partial rollout runs with the transformers rollout backend; with vLLM a sync lands between batches",
        ),
    ]
    return [{"loc": loc, "msg": msg} for loc, refused, msg in checks if refused]


# Where Hugging Face configs keep the number of positions the model can attend to.
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def model_context_length(model_path: str) -> int | None:
    """The policy's context length from its folder's config.json (None when there is no such file or key)."""
    try:
        hf_config: Any = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for section in (hf_config, hf_config.get("text_config") if isinstance(hf_config, dict) else None):
        if isinstance(section, dict):
            for key in _CONTEXT_KEYS:
                value = section.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
    return None


def context_length_errors(cfg: RunConfig) -> list[dict[str, str]]:
    """Responses must fit the model's context length, with room for at least one prompt token."""
    length = model_context_length(cfg.model.path)
    if length is None:
        return []
    limits: list[tuple[str, int | None]] = [
        ("rollout.max_new_tokens", cfg.rollout.max_new_tokens),
        ("logging.eval_max_new_tokens", cfg.logging.eval_max_new_tokens),
    ]
    return [
        {
            "loc": loc,
            "msg": f"{tokens} tokens do not fit the model's context length of {length} tokens "
            f"(the prompt needs room too): at most {length - 1}",
        }
        for loc, tokens in limits
        if tokens is not None and tokens >= length
    ]


def check_runnable(cfg: RunConfig) -> None:
    """Raises ConfigError naming every option combination the engine cannot run, and every length that
    does not fit the model."""
    errors = unsupported_errors(cfg) + context_length_errors(cfg)
    if errors:
        raise ConfigError(errors)
