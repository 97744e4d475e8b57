"""A run's resource needs (its driver, its bundles, their total) and how a person reads an amount of them. Here, in
runs, because the run page shows them; scheduling admits and places runs by them (posttrain.scheduling.rules)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from posttrain.runs.models import Run

RESOURCE_KEYS = ("CPU", "GPU")
Resources = dict[str, float]


def run_resources(run: Run) -> dict:
    """The run's stored resource needs; a run launched before they were stored reads them from its config."""
    if run.resources:
        return run.resources
    from rl_engine.spec.config import ConfigError, validate_config
    from rl_engine.spec.resources import resource_needs

    try:
        return resource_needs(validate_config(run.resolved_config))
    except ConfigError:  # a config this engine build no longer reads: it holds nothing we can count
        return {"driver": {"CPU": 0.0, "GPU": 0.0}, "bundles": [], "total": {"CPU": 0.0, "GPU": 0.0}}


def total_of(run: Run) -> Resources:
    total = run_resources(run)["total"]
    return {key: float(total.get(key, 0.0)) for key in RESOURCE_KEYS}


def amount(value: float, key: str) -> str:
    """`1 CPU`, `2 CPUs`, `0.5 GPUs`."""
    return f"{value:g} {key}{'' if math.isclose(value, 1.0) else 's'}"


def describe(resources: Mapping[str, float]) -> str:
    """`2 CPUs`, `1 CPU, 1 GPU`: what a person reads in a reason."""
    return ", ".join(
        amount(resources.get(key, 0.0), key) for key in RESOURCE_KEYS if resources.get(key, 0.0) or key == "CPU"
    )
