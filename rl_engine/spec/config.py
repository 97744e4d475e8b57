"""The run config as the platform uses it: validation with field errors (`ConfigError`), the rules of what
this engine can run, the JSON schema the launch form is generated from, YAML in and out, `--set`
overrides, and the demo's configs (the toy's, and the real model's task: `demo_smollm2`)."""

from rl_engine.config import (
    REWARD_TYPES,
    ConfigError,
    EnvironmentConfig,
    RewardSpec,
    RunConfig,
    check_runnable,
    config_json_schema,
    dump_config,
    parse_text,
    validate_config,
)
from rl_engine.config.overrides import OverrideError, apply_overrides
from rl_engine.demo import smollm2 as demo_smollm2
from rl_engine.demo.run_config import demo_run_config

__all__ = [
    "REWARD_TYPES",
    "ConfigError",
    "EnvironmentConfig",
    "OverrideError",
    "RewardSpec",
    "RunConfig",
    "apply_overrides",
    "check_runnable",
    "config_json_schema",
    "demo_run_config",
    "demo_smollm2",
    "dump_config",
    "parse_text",
    "validate_config",
]
