"""The roles as plain classes; `ray.remote` wraps them when the driver places them in the run's
placement group (see `driver.py`). Each runs in its own actor process."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from rl_engine.config import RunConfig
from rl_engine.distributed.process_stats import peak_rss_gb
from rl_engine.rollout import Sample, SamplingParams
from rl_engine.trainer import Experience, TokenBatch


class _Role:
    def ready(self) -> int:
        return os.getpid()

    def peak_memory_gb(self) -> float:
        return peak_rss_gb()


class RolloutWorker(_Role):
    """One rollout engine (vLLM, or transformers `generate` on its own copy of the policy)."""

    def __init__(self, cfg: RunConfig, weights_from: str | None, index: int):
        from rl_engine.loop import configure_threads, load_policy, load_tokenizer, rollout_backend
        from rl_engine.rollout import TransformersRollout

        configure_threads()
        torch.manual_seed(cfg.seed)
        tokenizer = load_tokenizer(cfg)
        path = weights_from or cfg.model.path
        if cfg.backends.rollout == "vllm":
            self.backend = rollout_backend(cfg, tokenizer, None, Path(path), engine_index=index)
        else:
            self.backend = TransformersRollout(load_policy(path, cfg).eval(), tokenizer, report_logprobs=True)

    def pad_id(self) -> int:
        return self.backend.pad_id

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> tuple[list[Sample], float]:
        started = time.perf_counter()
        samples = self.backend.generate(prompts, params)
        return samples, time.perf_counter() - started

    def load_weights_file(self, path: str) -> float:
        return self.backend.load_weights_file(path)

    def close(self) -> None:
        self.backend.close()


class TrainerWorker(_Role):
    """One rank of the policy (and PPO critic) trainer; ranks > 1 form a gloo (NCCL on GPU) group."""

    def __init__(self, cfg: RunConfig, weights_from: str | None, rank: int, world: int, master_port: int):
        from rl_engine.loop import (
            configure_threads,
            load_tokenizer,
            load_trainable_policy,
            model_construction,
            trainer_class,
        )
        from rl_engine.trainer import DTYPES, ValueModel

        configure_threads()
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK="0" if torch.cuda.is_available() else str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(master_port),
        )
        if world > 1 and cfg.backends.training == "torch":
            import torch.distributed as dist

            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=rank, world_size=world)
        torch.manual_seed(cfg.seed)
        self.cfg, self.rank = cfg, rank
        self.tokenizer = load_tokenizer(cfg)
        with model_construction(cfg):
            self.model = load_trainable_policy(cfg, Path(weights_from) if weights_from else None)
            critic = None
            if cfg.algorithm.needs_critic:
                critic = ValueModel.from_pretrained(
                    cfg.model.path, DTYPES[cfg.model.dtype], cfg.model.trust_remote_code
                )
        # The reference model is a role of its own (`ReferenceWorker`).
        self.trainer = trainer_class(cfg)(cfg, self.model, None, critic, rank=rank, world=world)

    def parameter_count(self) -> int:
        return sum(getattr(p, "ds_numel", p.numel()) for p in self.model.parameters())

    def forward(self, batch: TokenBatch, which: str) -> torch.Tensor:
        return self.trainer.forward(batch, which)

    def update(self, exp: Experience) -> dict[str, float]:
        return self.trainer.update(exp)

    def exact_training_logprobs(self) -> bool:
        return self.trainer.exact_training_logprobs

    def write_weights_file(self) -> str | None:
        """Every rank takes part (ZeRO-3 gathers); rank 0 writes the file and returns its path."""
        from rl_engine.backends.vllm_rollout import write_weights_file

        with self.trainer.full_weights():
            return write_weights_file(self.trainer.weights_view()) if self.rank == 0 else None

    def save_checkpoint(self, run_dir: str, step: int, state: Any, keep_last: int) -> str | None:
        from rl_engine.checkpoint import save_checkpoint

        weights = self.trainer.full_state_dict()  # a collective under ZeRO-3
        adapter = self.trainer.adapter_state_dict()  # likewise
        if self.rank != 0:
            return None
        return str(
            save_checkpoint(
                Path(run_dir), step, self.model, self.tokenizer, state, keep_last, weights=weights, adapter=adapter
            )
        )

    def state_dict(self) -> dict[str, Any]:
        return self.trainer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trainer.load_state_dict(state)


class ReferenceWorker(_Role):
    """The frozen initial policy, for KL."""

    def __init__(self, cfg: RunConfig):
        from rl_engine.loop import configure_threads, load_policy

        configure_threads()
        self.cfg = cfg
        self.model = load_policy(cfg.model.path, cfg).eval().requires_grad_(False)

    def forward(self, batch: TokenBatch) -> torch.Tensor:
        from rl_engine.trainer import batched_logprobs

        return batched_logprobs(self.model, batch, self.cfg.train.micro_batch_size, self.cfg.rollout.temperature)


class RewardWorker(_Role):
    def __init__(self, cfg: RunConfig):
        from rl_engine.loop import configure_threads
        from rl_engine.rewards import build_reward

        configure_threads()
        self.reward = build_reward([spec.model_dump() for spec in cfg.rewards])

    def score(self, batch: Any) -> Any:
        return self.reward.score(batch)

    def close(self) -> None:
        self.reward.close()
