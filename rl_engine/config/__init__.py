"""The run config: one typed schema for a post-training run (see docs/ARCHITECTURE.md, "Contracts").

The browser form (generated from `config_json_schema()`), the REST API validation, YAML
import/export, the CLI and the engine all read this package, so a config that validates here must
never fail later for a reason that could have been checked up front. Errors surface as
`ConfigError`, whose `errors` are `{"loc": "a.b.c", "msg": ...}` dicts ready for field-level display
in a form or a 400 response.

Where things are: `schema/` the sections and `RunConfig`; `rules.py` the rules across sections and
what this engine can run; `yaml_io.py` reading, validating and writing; `error_messages.py` turning
pydantic's errors into field errors. This package must stay importable without torch, ray, vllm or
Django.
"""

from rl_engine.config.errors import ConfigError
from rl_engine.config.rules import GROUP_ESTIMATORS, TOKEN_RETURN_ESTIMATORS, check_runnable, unsupported_errors
from rl_engine.config.schema import (
    REWARD_TYPES,
    SCHEMA_VERSION,
    AgentConfig,
    AlgorithmConfig,
    BackendConfig,
    BoxedMathReward,
    CheckpointConfig,
    DataConfig,
    EnvironmentConfig,
    ExactMatchReward,
    HttpReward,
    KLConfig,
    LengthPenaltyReward,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    OverlongConfig,
    PlacementConfig,
    PythonReward,
    ReasoningGymReward,
    RegexReward,
    RewardModelReward,
    RewardSpec,
    RolloutConfig,
    RolloutCorrectionConfig,
    RunConfig,
    TrainConfig,
    VerifiersReward,
)
from rl_engine.config.yaml_io import config_json_schema, dump_config, load_config, parse_text, validate_config

__all__ = [
    "GROUP_ESTIMATORS",
    "REWARD_TYPES",
    "SCHEMA_VERSION",
    "TOKEN_RETURN_ESTIMATORS",
    "AgentConfig",
    "AlgorithmConfig",
    "BackendConfig",
    "BoxedMathReward",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "EnvironmentConfig",
    "ExactMatchReward",
    "HttpReward",
    "KLConfig",
    "LengthPenaltyReward",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "OverlongConfig",
    "PlacementConfig",
    "PythonReward",
    "ReasoningGymReward",
    "RegexReward",
    "RewardModelReward",
    "RewardSpec",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "RunConfig",
    "TrainConfig",
    "VerifiersReward",
    "check_runnable",
    "config_json_schema",
    "dump_config",
    "load_config",
    "parse_text",
    "unsupported_errors",
    "validate_config",
]
