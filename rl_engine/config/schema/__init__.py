"""The run config's typed schema: one pydantic model per section, and `RunConfig` over them.

Every model forbids unknown keys (a typo is an error naming the field, not a silently ignored
setting) and every field carries a `description`, which the browser form shows as help text.
Rules that span sections live in `rules.py`; reading, writing and validating in `yaml_io.py`.

Where things are: `base.py` the shared section base; `model_data.py` the model and the dataset;
`rewards.py` the reward components; `algorithm.py` the algorithm; `rollout.py` generation and its
filters; `training.py` optimisation, engines, placement, checkpoints and logging; `executors.py` the
environment and the agent; `run.py` `RunConfig`.
"""

from rl_engine.config.schema.algorithm import AlgorithmConfig, KLConfig, OverlongConfig, RolloutCorrectionConfig
from rl_engine.config.schema.base import Dtype, PolicyDtype
from rl_engine.config.schema.executors import AgentConfig, EnvironmentConfig
from rl_engine.config.schema.model_data import DataConfig, LoraConfig, ModelConfig
from rl_engine.config.schema.rewards import (
    REWARD_TYPES,
    BoxedMathReward,
    ExactMatchReward,
    HttpReward,
    LengthPenaltyReward,
    PythonReward,
    ReasoningGymReward,
    RegexReward,
    RewardModelReward,
    RewardSpec,
    VerifiersReward,
)
from rl_engine.config.schema.rollout import (
    FiltersConfig,
    GibberishFilterConfig,
    RepetitionFilterConfig,
    RolloutConfig,
)
from rl_engine.config.schema.run import SCHEMA_VERSION, RunConfig
from rl_engine.config.schema.training import (
    BackendConfig,
    CheckpointConfig,
    LoggingConfig,
    PlacementConfig,
    TrainConfig,
)

__all__ = [
    "REWARD_TYPES",
    "SCHEMA_VERSION",
    "AgentConfig",
    "AlgorithmConfig",
    "BackendConfig",
    "BoxedMathReward",
    "CheckpointConfig",
    "DataConfig",
    "Dtype",
    "EnvironmentConfig",
    "ExactMatchReward",
    "FiltersConfig",
    "GibberishFilterConfig",
    "HttpReward",
    "KLConfig",
    "LengthPenaltyReward",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "OverlongConfig",
    "PlacementConfig",
    "PolicyDtype",
    "PythonReward",
    "ReasoningGymReward",
    "RegexReward",
    "RepetitionFilterConfig",
    "RewardModelReward",
    "RewardSpec",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "RunConfig",
    "TrainConfig",
    "VerifiersReward",
]
