"""The roles as plain classes; `ray.remote` wraps them when the driver places them in the run's
placement group (see `driver.py`). Each runs in its own actor process, on the device its slot's GPUs
decide (`rl_engine.devices.resolve_device`: Ray makes the GPUs it gave the actor `cuda:0...`)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rl_engine.config import RunConfig
from rl_engine.devices import gpu_memory_metrics, precision_for, resolve_device, use_device
from rl_engine.distributed.process_stats import peak_rss_gb
from rl_engine.partial_rollout import generate_in_segments
from rl_engine.rollout import Sample, SamplingParams, TransformersRollout
from rl_engine.trainer import Experience, TokenBatch


class _Role:
    device: torch.device = torch.device("cpu")

    def _place(self, cfg: RunConfig, gpus: float, role: str) -> torch.device:
        self.device = resolve_device(cfg, gpus, role)
        use_device(self.device)
        return self.device

    def ready(self) -> int:
        return os.getpid()

    def memory_metrics(self, role: str) -> dict[str, float]:
        """`memory/<role>_peak_gb` (resident) and, on a GPU, `memory/<role>_gpu_peak_gb`."""
        return {f"memory/{role}_peak_gb": peak_rss_gb(), **gpu_memory_metrics(role, self.device)}


class RolloutWorker(_Role):
    """One rollout engine (vLLM, or transformers `generate` on its own copy of the policy)."""

    def __init__(self, cfg: RunConfig, weights_from: str | None, index: int, gpus: float = 0.0):
        from rl_engine.components import configure_threads, load_policy, load_tokenizer, rollout_backend

        configure_threads()
        device = self._place(cfg, gpus, f"rollout engine {index}")
        torch.manual_seed(cfg.seed)
        tokenizer = load_tokenizer(cfg)
        path = weights_from or cfg.model.path
        if cfg.backends.rollout == "vllm":
            self.backend = rollout_backend(cfg, tokenizer, None, Path(path), engine_index=index, device=device)
        else:
            self.backend = TransformersRollout(load_policy(path, cfg, device).eval(), tokenizer)

        # The policy version the engine samples under (updates applied to its weights), recorded on every
        # sample; async mode keeps it (`set_policy_version` on resume, then each weight load's).
        self.policy_version = 0
        be = cfg.backends
        self.segment_tokens = be.partial_rollout_tokens if be.async_rollout and be.partial_rollout else None
        self._staged: tuple[dict[str, torch.Tensor], int] | None = None
        self._staging = threading.Lock()

    def pad_id(self) -> int:
        return self.backend.pad_id

    def set_policy_version(self, version: int) -> None:
        self.policy_version = version

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> tuple[list[Sample], float]:
        """The samples, each with its segments' policy versions, and the seconds it took. With partial
        rollout the batch is generated in segments, weights staged meanwhile taking effect between two."""
        started = time.perf_counter()
        if self.segment_tokens is None:
            samples = [
                replace(s, segments=((self.policy_version, len(s.response_ids)),))
                for s in self.backend.generate(prompts, params)
            ]
        else:
            samples = generate_in_segments(self.backend, prompts, params, self.segment_tokens, self._apply_staged)
        return samples, time.perf_counter() - started

    def sleep(self) -> None:
        self.backend.sleep()

    def load_weights_file(self, path: str, version: int | None = None) -> float:
        """Takes the weights now (between two calls: after the batches submitted before this one)."""
        took = self.backend.load_weights_file(path)
        if version is not None:
            self.policy_version = version
        return took

    def stage_weights(self, path: str, version: int) -> float:
        """Partial rollout: reads the weights a trainer wrote, to be applied by the generating thread at
        its next segment boundary (or its next batch). Called in a concurrency group of its own, so it
        runs while a batch generates; newer weights staged before the boundary replace older ones."""
        from safetensors.torch import load_file

        started = time.perf_counter()
        weights = load_file(path)
        with self._staging:
            self._staged = (weights, version)
        return time.perf_counter() - started

    def _apply_staged(self) -> int:
        with self._staging:
            staged, self._staged = self._staged, None
        if staged is not None:
            weights, version = staged
            # Only partial rollout stages weights, and the config rules allow it on the transformers backend only.
            assert isinstance(self.backend, TransformersRollout)
            self.backend.model.load_state_dict(weights, strict=True)
            self.policy_version = version
        return self.policy_version

    def receive_weights(self, step: str, payload: Any = None) -> None:
        """A step of a GPU weight transfer that trainer rank 0 drives (`vllm_rollout.WeightSender`)."""
        from rl_engine.backends.vllm_rollout import VLLMRollout  # already imported: the engine is vLLM's

        assert isinstance(self.backend, VLLMRollout)  # a GPU transfer reaches vLLM only (devices.weight_transfer)
        self.backend.receive_weights(step, payload)

    def memory_metrics(self, role: str) -> dict[str, float]:
        if hasattr(self.backend, "gpu_memory_metrics"):  # vLLM's worker is a process of its own
            return {f"memory/{role}_peak_gb": peak_rss_gb(), **self.backend.gpu_memory_metrics(role)}
        return super().memory_metrics(role)

    def close(self) -> None:
        self.backend.close()


class TrainerWorker(_Role):
    """One rank of the policy (and PPO critic) trainer; ranks > 1 form a gloo (NCCL on GPU) group."""

    def __init__(
        self, cfg: RunConfig, weights_from: str | None, rank: int, world: int, master_port: int, gpus: float = 0.0
    ):
        from rl_engine.components import (
            configure_threads,
            load_critic,
            load_tokenizer,
            load_trainable_policy,
            model_construction,
            partitioned_on_load,
            trainer_class,
        )

        configure_threads()
        device = self._place(cfg, gpus, f"trainer rank {rank}")
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK="0" if device.type == "cuda" else str(rank),  # Ray shows each rank its own GPU as 0
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(master_port),
        )
        if world > 1 and cfg.backends.training == "torch":
            import torch.distributed as dist

            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
        torch.manual_seed(cfg.seed)
        self.cfg, self.rank = cfg, rank
        self.tokenizer = load_tokenizer(cfg)
        precision = precision_for(cfg, device)
        place = None if partitioned_on_load(cfg) else device
        with model_construction(cfg, device):
            self.model = load_trainable_policy(cfg, Path(weights_from) if weights_from else None, place, precision)
            critic = load_critic(cfg, place, precision)
        # The reference model is a role of its own (`ReferenceWorker`).
        self.trainer = trainer_class(cfg)(cfg, self.model, None, critic, rank=rank, world=world, device=device)
        self.sender: Any = None

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

    def connect_engines(self, engines: list[Any], transfer: str) -> None:
        """Sets up the GPU weight transfer to the rollout actors `engines` ("ipc": every rank on its bundle's
        GPU; "nccl": rank 0 meets the engines' workers at a free port of this node). Every rank calls it."""
        import ray

        from rl_engine.backends.deepspeed_trainer import free_port
        from rl_engine.backends.vllm_rollout import ActorEnginesClient, WeightSender

        dtype = precision_for(self.cfg, self.device).compute
        client = ActorEnginesClient(engines)
        if transfer == "ipc":
            self.sender = WeightSender("ipc", client, dtype, rank=self.rank)
        else:
            address = ray.util.get_node_ip_address()
            port = int(free_port())
            self.sender = WeightSender(
                "nccl", client, dtype, rank=self.rank, address=address, port=port, world=1 + len(engines)
            )

    def send_weights(self) -> None:
        """One weight sync over the transfer `connect_engines` set up; every rank takes part."""
        with self.trainer.full_weights():
            self.sender.send(self.trainer.weights_view())

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

    def __init__(self, cfg: RunConfig, gpus: float = 0.0):
        from rl_engine.components import configure_threads, load_policy

        configure_threads()
        device = self._place(cfg, gpus, "reference model")
        self.cfg = cfg
        # Computed as the trainer computes its policy's log-probs, so the KL starts at 0.
        self.precision = precision_for(cfg, device)
        self.model = load_policy(cfg.model.path, cfg, device, self.precision.compute).eval().requires_grad_(False)

    def forward(self, batch: TokenBatch) -> torch.Tensor:
        from rl_engine.trainer import batched_logprobs

        with self.precision.autocast():
            return batched_logprobs(self.model, batch, self.cfg.train.micro_batch_size, self.cfg.rollout.temperature)


class RewardWorker(_Role):
    def __init__(self, cfg: RunConfig, gpus: float = 0.0):
        from rl_engine.components import build_configured_reward, configure_threads

        configure_threads()
        # Placement makes a reward worker only for a config with rewards (distributed.placement).
        self.reward = build_configured_reward(cfg, self._place(cfg, gpus, "reward worker"))

    def score(self, batch: Any) -> Any:
        return self.reward.score(batch)

    def close(self) -> None:
        self.reward.close()
