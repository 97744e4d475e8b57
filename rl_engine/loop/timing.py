"""Every phase of a step timed: `StepTimer` and the `timing/<phase>` metrics the run page stacks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class StepTimer:
    timings: dict[str, float] = field(default_factory=dict)
    overlapped_generate: float | None = None  # async mode: generation seconds spent off the critical path

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - started


# Stages always reported (0 when they did not run this step), then the ones reported only when they ran.
_TIMED_ALWAYS = ("reward", "forward_policy", "train", "weight_sync")


_TIMED = (
    "generate",
    "environment",
    "reward",
    "forward_reference",
    "forward_policy",
    "forward_values",
    "advantages",
    "correction",
    "train",
    "weight_sync",
    "wait_rollout",
    "record",
)


def timing_metrics(timer: StepTimer) -> dict[str, float]:
    return {
        f"timing/{stage}": timer.timings.get(stage, 0.0)
        for stage in _TIMED
        if stage in timer.timings or stage in _TIMED_ALWAYS
    }
