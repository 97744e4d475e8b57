"""`RunConfig`: the whole run config over its sections, with the rules that span them."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rl_engine.config.errors import FieldErrors
from rl_engine.config.rules import cross_field_errors
from rl_engine.config.schema.algorithm import AlgorithmConfig
from rl_engine.config.schema.base import _Section
from rl_engine.config.schema.executors import AgentConfig, EnvironmentConfig
from rl_engine.config.schema.model_data import DataConfig, ModelConfig
from rl_engine.config.schema.rewards import RewardSpec
from rl_engine.config.schema.rollout import RolloutConfig
from rl_engine.config.schema.training import (
    BackendConfig,
    CheckpointConfig,
    LoggingConfig,
    PlacementConfig,
    TrainConfig,
)

SCHEMA_VERSION = 1

_RUN_NAME_RE = re.compile(r"^[A-Za-z0-9_.\- ]+$")


class RunConfig(_Section):
    """A complete, self-contained description of one post-training run."""

    schema_version: Literal[1] = Field(default=1, description="Version of this config schema.")
    name: str = Field(min_length=1, max_length=100, description="Run name: letters, digits, spaces and - _ .")
    seed: int = Field(default=0, description="Random seed for data order, sampling and initialisation.")
    description: str = Field(default="", description="Free-text notes about the run.")
    model: ModelConfig = Field(description="The policy model.")
    data: DataConfig = Field(description="The prompt dataset.")
    rewards: list[RewardSpec] = Field(
        default_factory=list,
        description="Reward components; the reward is their weighted sum (plus the environment's, if any).",
    )
    environment: EnvironmentConfig | None = Field(
        default=None, description="Multi-turn environment (none = one response per prompt)."
    )
    agent: AgentConfig | None = Field(
        default=None, description="External agent executor over an OpenAI-compatible endpoint (none = off)."
    )
    algorithm: AlgorithmConfig = Field(
        default_factory=AlgorithmConfig, description="RL algorithm: advantage estimator, policy loss, KL."
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Response generation.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Policy optimisation.")
    backends: BackendConfig = Field(default_factory=BackendConfig, description="Generation and training engines.")
    placement: PlacementConfig = Field(default_factory=PlacementConfig, description="Ray resource placement.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpointing.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Evaluation and logging.")

    @field_validator("schema_version", mode="before")
    @classmethod
    def _known_version(cls, v: Any) -> Any:
        if v != SCHEMA_VERSION:
            raise ValueError(f"unsupported schema_version {v!r}; this engine reads version {SCHEMA_VERSION}")
        return v

    @field_validator("name")
    @classmethod
    def _slug(cls, v: str) -> str:
        if not _RUN_NAME_RE.match(v) or not v.strip():
            raise ValueError("may contain only letters, digits, spaces and - _ .")
        return v

    @property
    def samples_per_step(self) -> int:
        return self.rollout.prompts_per_step * self.rollout.samples_per_prompt

    @property
    def ratio_against_behaviour(self) -> bool:
        """Whether the policy loss's ratio is taken against the rollout engine's log-probs (the behaviour
        policy) rather than the trainer's before the update (`algorithm.ratio_against`, `auto` resolved)."""
        alg = self.algorithm
        if alg.ratio_against != "auto":
            return alg.ratio_against == "behaviour"
        weighs_itself = alg.loss.behaviour_weighted or alg.rollout_correction.spec.changes_loss
        return self.backends.async_rollout and not weighs_itself

    @model_validator(mode="after")
    def _cross_field(self) -> RunConfig:
        errors = cross_field_errors(self)
        if errors:
            raise FieldErrors(errors)
        return self
