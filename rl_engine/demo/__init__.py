"""Offline demo task: two-digit addition with a small Qwen2 policy built from scratch.

``python -m rl_engine.demo build DIR`` writes the model, tokenizer and prompt files; see
:mod:`rl_engine.demo.build`. Imports are lazy so that ``rl_engine.demo.task`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["build_demo", "evaluate_greedy", "existing_build"]

if TYPE_CHECKING:
    from rl_engine.demo.build import build_demo, existing_build
    from rl_engine.demo.evaluate import evaluate_greedy


def __getattr__(name: str) -> Any:
    if name in ("build_demo", "existing_build"):
        from rl_engine.demo import build

        return getattr(build, name)
    if name == "evaluate_greedy":
        from rl_engine.demo.evaluate import evaluate_greedy

        return evaluate_greedy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
