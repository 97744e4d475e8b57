"""The engine's wiring: `Engine`, everything a run holds between steps, and `build_engine`, which builds the
one-process roles (every role in the driver) or the Ray roles (`rl_engine.distributed`) from the config."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from rl_engine.checkpoint import EngineState, save_checkpoint
from rl_engine.components import (
    build_executor,
    build_reward_or_none,
    load_critic,
    load_policy,
    load_tokenizer,
    load_trainable_policy,
    model_construction,
    partitioned_on_load,
    rollout_backend,
    trainer_class,
)
from rl_engine.config import RunConfig, check_runnable
from rl_engine.data import PromptData, PromptSampler
from rl_engine.devices import (
    gpu_memory_metrics,
    precision_for,
    resolve_device,
    use_device,
    with_host_dtype,
)
from rl_engine.interfaces import ExecutorRole, LocalTrainer, RewardRole, RolloutRole, TrainerRole
from rl_engine.ledger import PromptLedger

if TYPE_CHECKING:
    from rl_engine.distributed import RayRoles
    from rl_engine.loop.prefetch import PendingRollout


@dataclass
class Engine:
    """Everything a run holds between steps. With Ray roles (`roles`), `model` is None: the policy
    lives in the trainer ranks, and `trainer`, `rollout` and `reward` are the roles' proxies."""

    cfg: RunConfig
    tokenizer: Any
    model: torch.nn.Module | None
    trainer: TrainerRole  # TorchTrainer / DeepSpeedTrainer, or distributed.RayTrainer
    rollout: RolloutRole  # TransformersRollout / VLLMRollout, or distributed.RayRollout
    reward: RewardRole | None  # CompositeReward, or distributed.RayReward; None: the environment's only
    data: PromptData
    sampler: PromptSampler
    roles: RayRoles | None = None  # when the roles are actors
    # Async mode: the batches generated ahead, for the next steps in order.
    pending: deque[PendingRollout] = field(default_factory=deque)
    device: torch.device | None = None  # the one-process engine's (None with Ray roles: each has its own)
    # Single turn, an environment or an agent, over `rollout`: built from it after the fields above.
    executor: ExecutorRole = field(init=False)
    # The fate of every training row in every epoch (restored from a checkpoint on resume).
    ledger: PromptLedger = field(init=False)

    def __post_init__(self) -> None:
        self.executor = build_executor(self.cfg, self.rollout, self.tokenizer)
        self.ledger = PromptLedger(len(self.data.train))

    def sync_weights(self) -> float:
        if self.roles is not None:
            return self.roles.sync_weights()
        trainer = cast(LocalTrainer, self.trainer)
        with trainer.full_weights():  # whole weights even when ZeRO-3 partitions them
            return self.rollout.sync_weights(trainer.weights_view())

    def save_checkpoint(self, run_dir: Path, step: int, state: EngineState) -> Path:
        keep = self.cfg.checkpoint.keep_last
        if self.roles is not None:
            return self.roles.trainer.save_checkpoint(run_dir, step, state, keep)
        trainer = cast(LocalTrainer, self.trainer)
        return save_checkpoint(
            run_dir,
            step,
            self.model,
            self.tokenizer,
            state,
            keep,
            weights=trainer.full_state_dict(),
            adapter=trainer.adapter_state_dict(),
        )

    def peak_memory(self) -> dict[str, float]:
        """Peak resident GiB of each role's process (with its children, e.g. vLLM's engine core)."""
        from rl_engine.distributed.process_stats import peak_rss_gb

        # With actors, the driver's children are a local Ray's own processes: the driver alone then.
        memory = {
            "memory/driver_peak_gb": peak_rss_gb(children=self.roles is None),
            **gpu_memory_metrics("driver", self.device),
        }
        if self.roles is not None:
            memory.update(self.roles.peak_memory_gb())
        elif hasattr(self.rollout, "gpu_memory_metrics"):  # an engine in processes of its own (vLLM)
            memory.update(self.rollout.gpu_memory_metrics())
        return memory

    def parameter_count(self) -> int:
        if self.roles is not None:
            return self.roles.trainer.parameter_count()
        assert self.model is not None  # the policy is in this process when no Ray roles hold it (build_engine)
        return sum(getattr(p, "ds_numel", p.numel()) for p in self.model.parameters())  # ZeRO-3: placeholders

    def close(self) -> None:
        try:
            self.executor.close()
            self.rollout.close()
            if self.reward is not None:
                self.reward.close()
        finally:
            if self.roles is not None:
                self.roles.close()


def build_engine(cfg: RunConfig, weights_from: Path | None = None) -> Engine:
    cfg = with_host_dtype(cfg)
    check_runnable(cfg)
    from rl_engine.lora import refuse_qlora_without_cuda

    refuse_qlora_without_cuda(cfg)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    tokenizer = load_tokenizer(cfg)
    from rl_engine.distributed import RayRoles, driver_gpus, uses_actors

    if uses_actors(cfg):
        data = PromptData.load(cfg.data, tokenizer, cfg.seed)
        roles = RayRoles(cfg, weights_from)
        return Engine(
            cfg=cfg,
            tokenizer=tokenizer,
            model=None,
            trainer=roles.trainer,
            rollout=roles.rollout,
            reward=roles.reward,
            data=data,
            sampler=PromptSampler(len(data.train), cfg.seed, cfg.data.shuffle),
            roles=roles,
        )
    # Every role in this process: the GPU Ray gave the job's driver, or the CPU.
    device = resolve_device(cfg, driver_gpus(cfg), "hybrid engine (every role in the driver)")
    refuse_qlora_without_cuda(cfg, device)
    use_device(device)
    precision = precision_for(cfg, device)
    place = None if partitioned_on_load(cfg) else device
    with model_construction(cfg, device):
        model = load_trainable_policy(cfg, weights_from, place, precision)
        ref_model = None
        if cfg.algorithm.kl.coef > 0:
            ref_model = load_policy(cfg.model.path, cfg, place, precision.compute).eval().requires_grad_(False)
        critic = load_critic(cfg, place, precision)
    data = PromptData.load(cfg.data, tokenizer, cfg.seed)
    return Engine(
        cfg=cfg,
        tokenizer=tokenizer,
        model=model,
        trainer=trainer_class(cfg)(cfg, model, ref_model, critic, device=device),
        rollout=rollout_backend(cfg, tokenizer, model, weights_from, device=device, precision=precision),
        reward=build_reward_or_none(cfg, device),
        data=data,
        sampler=PromptSampler(len(data.train), cfg.seed, cfg.data.shuffle),
        device=device,
    )
