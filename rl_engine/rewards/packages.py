"""Rewards of installed environment packages: reasoning-gym's `score_answer` and verifiers' reward functions,
each through its adapter file (`rl_engine/environments/adapters/`) in the sandbox like a user's reward file.
Standard library only, like the rest of this package at import time."""

from __future__ import annotations

from pathlib import Path

from rl_engine.rewards.python_fn import PythonFunctionReward

ADAPTERS = Path(__file__).resolve().parents[1] / "environments" / "adapters"
REASONING_GYM = ADAPTERS / "reasoning_gym_tasks.py"
VERIFIERS = ADAPTERS / "verifiers_tasksets.py"


def reasoning_gym_reward(
    name: str = "reasoning_gym", answer: str = "tag", timeout_s: float = 10.0, memory_mb: float = 2048
) -> PythonFunctionReward:
    """The `reasoning_gym` reward type: the task's own `score_answer` on generated rows (verl's per-sample shape)."""
    functions = {"tag": "compute_score", "whole": "compute_score_whole", "last_number": "compute_score_last_number"}
    if answer not in functions:
        raise ValueError(f"answer: must be 'tag', 'whole' or 'last_number', got {answer!r}")
    function = functions[answer]
    return PythonFunctionReward(
        str(REASONING_GYM), name=name, function=function, timeout_s=timeout_s, memory_mb=memory_mb, batch=False
    )


def verifiers_reward(
    name: str = "verifiers", files: list[str] | None = None, timeout_s: float = 30.0, memory_mb: float = 3072
) -> PythonFunctionReward:
    """The `verifiers` reward type: each generated row's task scored by its own reward functions (`Task.score`),
    `files` shown beside the adapter; each function's score is kept beside the total."""
    return PythonFunctionReward(
        str(VERIFIERS),
        name=name,
        function="compute_score",
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        batch=False,
        files=list(files or []),
    )
