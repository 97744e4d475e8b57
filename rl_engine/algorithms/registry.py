"""The functions behind the catalogue's names, registered with decorators next to their code.

    @ADVANTAGE_ESTIMATORS.register("grpo")
    def _grpo(inputs: AdvantageInputs) -> tuple[Tensor, Tensor | None]: ...

A name must be in the catalogue (`catalogue.py`) to be registered, and `get` imports the module that
registers a kind before looking a name up, so the loop and the trainer dispatch by name whatever was
imported before. This module itself is torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any, Generic, TypeVar

from rl_engine.algorithms import catalogue

__all__ = ["ADVANTAGE_ESTIMATORS", "POLICY_LOSS_FUNCTIONS", "ROLLOUT_CORRECTIONS", "Registry"]

F = TypeVar("F", bound=Callable[..., Any])


class Registry(Generic[F]):
    """Name → function for one kind of algorithm; `declared` are the catalogue's specs of that kind."""

    def __init__(self, kind: str, declared: Mapping[str, Any], home: str):
        self.kind = kind
        self.declared = declared
        self.home = home  # the module whose import registers every function of this kind
        self._functions: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Registers the decorated function under `name`, which the catalogue must declare."""
        if name not in self.declared:
            raise ValueError(f"{self.kind} {name!r} is not in the catalogue (rl_engine/algorithms/catalogue.py)")

        def decorator(fn: F) -> F:
            if name in self._functions and self._functions[name] is not fn:
                raise ValueError(f"{self.kind} {name!r} is registered twice ({self._functions[name].__qualname__})")
            self._functions[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        import_module(self.home)
        try:
            return self._functions[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; expected one of: {', '.join(self.names())}") from None

    def names(self) -> tuple[str, ...]:
        import_module(self.home)
        return tuple(self._functions)


ADVANTAGE_ESTIMATORS: Registry[Callable[..., Any]] = Registry(
    "advantage estimator", catalogue.ESTIMATORS, "rl_engine.algorithms.advantages"
)
POLICY_LOSS_FUNCTIONS: Registry[Callable[..., Any]] = Registry(
    "policy loss", catalogue.POLICY_LOSSES, "rl_engine.algorithms.policy_losses"
)
ROLLOUT_CORRECTIONS: Registry[Callable[..., Any]] = Registry(
    "rollout correction", catalogue.CORRECTIONS, "rl_engine.algorithms.corrections"
)
