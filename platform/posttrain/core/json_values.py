"""Reading numbers out of parsed JSON, where 2 and 2.0 are the same integer and true is not one."""

from __future__ import annotations

import math
from typing import Any


def json_integer(value: Any) -> int | None:
    """An int from JSON (2 or 2.0), None for anything else (booleans included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None
