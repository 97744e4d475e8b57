"""The parts an engine is built from, in any process: the tokenizer, the policy (with LoRA adapters), the
reward, the executor, the rollout backend and the trainer class. The one-process engine
(`rl_engine.loop.build_engine`) and the Ray actors (`rl_engine.distributed.roles`) both build from here,
so neither imports the other (docs/ARCHITECTURE.md, "One way down")."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rl_engine.config import RunConfig
from rl_engine.devices import DTYPES, Precision, policy_dtype, weight_transfer
from rl_engine.interfaces import ExecutorRole, RolloutRole
from rl_engine.rewards import CompositeReward, build_reward
from rl_engine.rollout import TransformersRollout
from rl_engine.trainer import TorchTrainer, ValueModel

if TYPE_CHECKING:
    from rl_engine.backends.vllm_rollout import VLLMRollout


def build_executor(cfg: RunConfig, rollout: RolloutRole, tokenizer: Any) -> ExecutorRole:
    from rl_engine.executors import EnvironmentExecutor, SingleTurnExecutor

    if cfg.agent is not None:
        from rl_engine.agent_endpoint import AgentExecutor

        return AgentExecutor(rollout, tokenizer, cfg)
    if cfg.environment is not None:
        return EnvironmentExecutor(rollout, tokenizer, cfg.environment)
    return SingleTurnExecutor(rollout)


def build_reward_or_none(cfg: RunConfig, device: torch.device | None = None) -> CompositeReward | None:
    """The configured reward components (a reward model on `device`, the role's); None when an environment
    gives the only reward."""
    if not cfg.rewards:
        return None
    return build_configured_reward(cfg, device)


def build_configured_reward(cfg: RunConfig, device: torch.device | None = None) -> CompositeReward:
    """The reward components of a config that has some (a reward model on `device`, the role's)."""
    specs = [spec.model_dump() for spec in cfg.rewards]
    for spec in specs:
        if spec["type"] == "reward_model" and device is not None:
            spec["device"] = str(device)
    return build_reward(specs)


def load_tokenizer(cfg: RunConfig) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        cfg.model.tokenizer_path or cfg.model.path, trust_remote_code=cfg.model.trust_remote_code
    )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(
    path: str | Path, cfg: RunConfig, device: torch.device | None = None, dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """A causal LM from a Hugging Face folder in `dtype` (default: the run's), on `device` (default: where
    it loads; under ZeRO-3 DeepSpeed places the partitions). Attention is transformers' default, PyTorch's
    SDPA, for the architectures that have it."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=dtype or DTYPES[policy_dtype(cfg)], trust_remote_code=cfg.model.trust_remote_code
    )
    if cfg.model.gradient_checkpointing:
        # Non-reentrant: gradients reach LoRA adapters behind a frozen embedding without extra hooks.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model if device is None else model.to(device)


def load_trainable_policy(
    cfg: RunConfig, weights_from: Path | None, device: torch.device | None = None, precision: Precision | None = None
) -> torch.nn.Module:
    """The policy that trains: the model (or a checkpoint's weights), or with LoRA the base model with
    fresh adapters (or a checkpoint's adapter). Under mixed precision the trained weights load in fp32
    (`precision.master`); a LoRA base, which never trains, stays in the compute dtype (peft keeps its
    adapters in fp32)."""
    from rl_engine import lora

    if not lora.enabled(cfg):
        return load_policy(weights_from or cfg.model.path, cfg, device, precision and precision.master)
    # On resume the base is still the model (a checkpoint's folder holds the merged weights).
    quantized = cfg.model.lora.quantize_base == "4bit"
    base = (
        lora.load_quantized_base(cfg.model.path, cfg)
        if quantized
        else load_policy(cfg.model.path, cfg, device, precision and precision.compute)
    )
    model = lora.apply_lora(base, cfg)
    if weights_from is not None:
        lora.load_adapter(model, weights_from)
    return model


def load_critic(cfg: RunConfig, device: torch.device | None, precision: Precision) -> ValueModel | None:
    """PPO's value model, initialised from the policy's weights in the master dtype; None for the algorithms
    without a critic. The one-process engine and the Ray trainer ranks both build it here."""
    if not cfg.algorithm.needs_critic:
        return None
    return ValueModel.from_pretrained(
        cfg.model.path,
        precision.master,
        cfg.model.trust_remote_code,
        device=device,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
    )


def partitioned_on_load(cfg: RunConfig) -> bool:
    """Under ZeRO-3 the models are partitioned onto the device as they load: nothing is moved after."""
    return cfg.backends.training == "deepspeed" and cfg.backends.zero_stage == 3


def model_construction(cfg: RunConfig, device: torch.device | None = None) -> AbstractContextManager[None]:
    """Where the models are loaded: partitioned onto `device` as they load under DeepSpeed ZeRO-3."""
    if cfg.backends.training != "deepspeed":
        return nullcontext()
    from rl_engine.backends.deepspeed_trainer import model_construction  # deepspeed only when chosen

    return model_construction(cfg, device)


def trainer_class(cfg: RunConfig) -> type[TorchTrainer]:
    if cfg.backends.training == "deepspeed":
        from rl_engine.backends.deepspeed_trainer import DeepSpeedTrainer

        return DeepSpeedTrainer
    return TorchTrainer


def rollout_backend(
    cfg: RunConfig,
    tokenizer: Any,
    model: torch.nn.Module | None,
    weights_from: Path | None,
    engine_index: int = 0,
    *,
    device: torch.device | None = None,
    precision: Precision | None = None,
) -> TransformersRollout | VLLMRollout:
    """The generation engine on `device`; `model` is the policy module (shared by the transformers backend,
    which reports each token's log-prob under the distribution it sampled from, computed as the trainer
    computes: `precision`), None in a rollout actor, which always runs vLLM through here (`engine_index` =
    the actor's place)."""
    device = device or torch.device("cpu")
    if cfg.backends.rollout != "vllm":
        autocast = precision.autocast if precision is not None else nullcontext
        return TransformersRollout(model, tokenizer, autocast=autocast)
    from rl_engine.backends.vllm_rollout import VLLMRollout  # vllm only when chosen

    # Room for the longest prompt plus the longest response, within what the model's positions allow.
    response = max(cfg.rollout.max_new_tokens, cfg.logging.eval_max_new_tokens or 0)
    longest = cfg.data.max_prompt_tokens + response
    if cfg.environment is not None:  # every turn's action and observation stay in the context
        env = cfg.environment
        longest += (env.max_turns + 1) * (response + env.max_observation_tokens)
    if model is None:
        from transformers import AutoConfig

        model_config = AutoConfig.from_pretrained(
            str(weights_from or cfg.model.path), trust_remote_code=cfg.model.trust_remote_code
        )
    else:
        model_config = model.config
    positions = getattr(model_config, "max_position_embeddings", None) or longest
    # On resume the engine starts from the checkpoint's weights, as the policy does.
    return VLLMRollout(
        weights_from or cfg.model.path,
        tokenizer,
        tokenizer_path=cfg.model.tokenizer_path or cfg.model.path,
        dtype=policy_dtype(cfg),
        seed=cfg.seed,
        max_model_len=min(longest, positions),
        kv_cache_gb=cfg.backends.vllm_kv_cache_gb,
        trust_remote_code=cfg.model.trust_remote_code,
        engine_index=engine_index,
        takes_turns=model is not None,
        device=device.type,
        transfer=weight_transfer(cfg, device),
        sleeps=cfg.placement.mode == "colocate",  # a trainer shares the engine's GPU
    )


def configure_threads() -> None:
    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
