"""Build reward components from plain dict specs (the shape of the run config's reward section).

A spec is ``{"type": <type>, **params}``; the params are exactly the component constructor's
keyword arguments, so the typed config (a discriminated union on ``type``) maps 1:1. Every
component takes an optional ``name`` (defaults to its type); names must be unique within a
composite. ``build_reward`` also reads an optional ``weight`` (default 1.0) from each spec. A spec's
``max_error_rate`` belongs to the run (the score stage enforces it: rl_engine.rewards.loud), not to the
component, and is set aside here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from rl_engine.outbound import OutboundPolicy
from rl_engine.rewards.base import CompositeReward, RewardComponent
from rl_engine.rewards.http import HttpReward
from rl_engine.rewards.packages import reasoning_gym_reward, verifiers_reward
from rl_engine.rewards.python_fn import PythonFunctionReward
from rl_engine.rewards.reward_model import RewardModelReward
from rl_engine.rewards.verifiers import BoxedMath, ExactMatch, LengthPenalty, RegexReward

COMPONENT_TYPES: dict[str, Callable[..., RewardComponent]] = {
    "exact_match": ExactMatch,
    "boxed_math": BoxedMath,
    "regex": RegexReward,
    "length_penalty": LengthPenalty,
    "python": PythonFunctionReward,
    "http": HttpReward,
    "reward_model": RewardModelReward,
    "reasoning_gym": reasoning_gym_reward,
    "verifiers": verifiers_reward,
}


# Fields of a spec the run reads, not the component.
RUN_LEVEL_FIELDS = ("max_error_rate",)


def build_component(spec: dict[str, Any], *, outbound: OutboundPolicy | None = None) -> RewardComponent:
    """A component from ``{"type": ..., **params}``. Raises ValueError naming the bad field. `outbound`: the
    policy an http reward's requests go under (default: the one the platform handed this process)."""
    if not isinstance(spec, dict):
        raise ValueError(f"reward spec must be a dict, got {type(spec).__name__}")
    params = {k: v for k, v in spec.items() if k not in RUN_LEVEL_FIELDS}
    kind = params.pop("type", None)
    if kind not in COMPONENT_TYPES:
        raise ValueError(f"type: unknown reward type {kind!r}; expected one of {', '.join(COMPONENT_TYPES)}")
    factory = COMPONENT_TYPES[kind]
    accepted = inspect.signature(factory).parameters
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"{unknown[0]}: not a parameter of reward type {kind!r} (accepted: {', '.join(accepted)})")
    missing = [p.name for p in accepted.values() if p.default is inspect.Parameter.empty and p.name not in params]
    if missing:
        raise ValueError(f"{missing[0]}: required for reward type {kind!r}")
    params.setdefault("name", kind)
    if kind == "http" and outbound is not None:
        params["policy"] = outbound
    return factory(**params)


def build_reward(specs: list[dict[str, Any]]) -> CompositeReward:
    """A composite from a list of specs, each with an optional ``weight`` (default 1.0)."""
    components = []
    for spec in specs:
        spec = dict(spec)
        weight = spec.pop("weight", 1.0)
        components.append((build_component(spec), weight))
    return CompositeReward(components)
