"""How the run trains and where: optimisation, the engines, Ray placement, checkpoints and logging."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from posttrain_sdk import rollout_files
from rl_engine.config.schema.base import _Section


class TrainConfig(_Section):
    """Optimisation of the policy."""

    steps: int = Field(default=100, ge=1, description="Training steps (one rollout batch each).")
    lr: float = Field(default=1e-5, gt=0, description="Policy learning rate (AdamW).")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear learning-rate warm-up steps.")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        default="constant", description="Learning-rate decay after warm-up."
    )
    epochs_per_batch: int = Field(default=1, ge=1, description="Passes over each rollout batch.")
    mini_batch_size: int | None = Field(
        default=None, ge=1, description="Samples per optimizer step; empty = all samples of the step."
    )
    micro_batch_size: int = Field(
        default=8, ge=1, description="Samples per forward/backward pass (gradients accumulate)."
    )
    grad_clip: float | None = Field(default=1.0, gt=0, description="Gradient-norm clip; empty = off.")
    max_wall_s: float | None = Field(
        default=None,
        gt=0,
        description="Stop with a checkpoint once the run's steps took this many seconds (progress/train_time_s, "
        "summed over resumes); empty = no limit. The scheduler also takes it as the run's longest length.",
    )

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError("each beta must be in [0, 1)")
        return v


class BackendConfig(_Section):
    """Which engines generate and train."""

    rollout: Literal["transformers", "vllm"] = Field(default="transformers", description="Generation engine.")
    training: Literal["torch", "deepspeed"] = Field(default="torch", description="Training engine.")
    zero_stage: Literal[0, 1, 2, 3] = Field(default=0, description="DeepSpeed ZeRO stage (0 = off).")
    offload: bool = Field(default=False, description="Offload optimizer state to CPU memory (DeepSpeed ZeRO).")
    vllm_kv_cache_gb: float = Field(default=1.0, gt=0, description="KV cache size per vLLM engine, in GB.")
    async_rollout: bool = Field(
        default=False, description="Generate the next batches while training (up to max_staleness updates behind)."
    )
    max_staleness: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Async rollout: batches generated ahead of training, so a sample's policy is at most this "
        "many updates behind the trainer (1 = one batch ahead).",
    )
    partial_rollout: bool = Field(
        default=False,
        description="Async rollout: a weight sync interrupts the responses being generated, which continue "
        "under the new weights (each segment records its policy version); transformers rollout only.",
    )
    partial_rollout_tokens: int = Field(
        default=16, ge=1, description="Partial rollout: tokens generated between two chances to take new weights."
    )


class PlacementConfig(_Section):
    """How the run's actors are placed on Ray."""

    mode: Literal["colocate", "separate"] = Field(
        default="colocate", description="Share resources between rollout and training, or keep them apart."
    )
    rollout_engines: int = Field(default=1, ge=1, description="Number of rollout engines.")
    trainer_ranks: int = Field(default=1, ge=1, description="Number of training processes.")
    cpus_per_rollout_engine: float = Field(default=1, ge=0, description="CPUs reserved per rollout engine.")
    cpus_per_trainer: float = Field(default=1, ge=0, description="CPUs reserved per training process.")
    gpus_per_rollout_engine: float = Field(default=0, ge=0, description="GPUs reserved per rollout engine.")
    gpus_per_trainer: float = Field(default=0, ge=0, description="GPUs reserved per training process.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="Where the models run: auto = on CUDA for each role that placement gives a GPU "
        "(gpus_per_*), on the CPU for the others.",
    )
    device_peak_tflops: float | None = Field(
        default=None,
        gt=0,
        description="Peak TFLOP/s of one device in the compute dtype, for throughput/train_mfu; empty = "
        "the GPU's datasheet figure (known GPUs only).",
    )


class CheckpointConfig(_Section):
    """When checkpoints are written."""

    every_steps: int = Field(default=0, ge=0, description="Save every N steps (0 = only at the end).")
    keep_last: int = Field(default=2, ge=1, description="Keep this many most recent checkpoints.")
    save_final: bool = Field(default=True, description="Save a checkpoint when the run finishes.")


class LoggingConfig(_Section):
    """Evaluation, samples and run-directory output."""

    run_dir: str | None = Field(default=None, description="Output folder; empty = ./runs/<name>-<timestamp>.")
    eval_every: int = Field(default=10, ge=0, description="Evaluate every N steps (0 = never).")
    eval_size: int = Field(default=500, ge=1, description="Held-out prompts used per evaluation.")
    eval_max_new_tokens: int | None = Field(
        default=None,
        ge=1,
        le=rollout_files.MAX_NEW_TOKENS,
        description="Response limit during evaluation; empty = rollout.max_new_tokens.",
    )
    samples: Literal["all", "none"] = Field(
        default="all", description="Record each step's rollouts as a Parquet file (all) or not (none)."
    )
    token_view_every: int = Field(
        default=1,
        ge=0,
        description="Record the per-token view (token ids and text, log-probs, entropy, advantage, IS weight per "
        "token) in the rollout file of every N-th step (0 = never).",
    )
    rollouts_keep: str = Field(
        default="all",
        pattern=r"^(all|every [1-9][0-9]*|last [1-9][0-9]*)$",
        description="Which steps' rollout files to keep: all, 'every K' (steps divisible by K) or 'last N'.",
    )
    rollouts_dir: str | None = Field(
        default=None,
        description="Where each step's rollout file goes (a folder or an fsspec URL such as s3://bucket/prefix); "
        "empty = <run_dir>/rollouts.",
    )
    heartbeat_s: float = Field(default=10, gt=0, description="Seconds between heartbeat events.")
