"""Reward components for the RL engine (rules, python sandbox, HTTP server, reward model).

Importing this package loads only the standard library; torch/transformers load when a
reward model is first used.
"""

from rl_engine.rewards.base import (
    ComponentResult,
    CompositeReward,
    RewardBatch,
    RewardComponent,
    RewardResult,
)
from rl_engine.rewards.http import HttpReward
from rl_engine.rewards.python_fn import PythonFunctionReward, check_reward_file
from rl_engine.rewards.registry import COMPONENT_TYPES, build_component, build_reward
from rl_engine.rewards.reward_model import RewardModelReward
from rl_engine.rewards.verifiers import BoxedMath, ExactMatch, LengthPenalty, RegexReward

__all__ = [
    "BoxedMath",
    "COMPONENT_TYPES",
    "ComponentResult",
    "CompositeReward",
    "ExactMatch",
    "HttpReward",
    "LengthPenalty",
    "PythonFunctionReward",
    "RegexReward",
    "RewardBatch",
    "RewardComponent",
    "RewardModelReward",
    "RewardResult",
    "build_component",
    "build_reward",
    "check_reward_file",
]
