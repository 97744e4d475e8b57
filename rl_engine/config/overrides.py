"""`--set key.path=value` overrides of a config dict: `python -m rl_engine train --set`, `manage.py demo_launch
--set` and the benchmarks."""

from __future__ import annotations

from typing import Any

import yaml


class OverrideError(ValueError):
    """An override that cannot apply, named as it was given."""


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`key.path=value` overrides (values read as YAML scalars) applied to a config dict in place, which is
    returned.

    A field of an optional section the config leaves out (`agent: null`, or no key at all) creates the
    section: the config's validation then fills in the section's other fields with their defaults."""
    for item in overrides:
        if "=" not in item:
            raise OverrideError(f"--set {item!r}: expected key.path=value")
        key, raw = item.split("=", 1)
        target = data
        parts = key.split(".")
        for part in parts[:-1]:
            if target.get(part) is None:
                target[part] = {}
            target = target[part]
            if not isinstance(target, dict):
                raise OverrideError(f"--set {key}: {part!r} is not a section")
        target[parts[-1]] = yaml.safe_load(raw)
    return data
