"""How a series' points are stored and parsed: packed little-endian float64 arrays, NaN for anything not
finite."""

from __future__ import annotations

import math
import uuid
from typing import Any

import numpy as np

_DTYPE = np.dtype("<f8")  # little-endian float64, whatever the machine

RunId = uuid.UUID | str


def _pack(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values, dtype=_DTYPE).tobytes()


def _unpack(raw: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(raw, dtype=_DTYPE)


def _as_float(value: Any) -> float:
    """A stored metric value: finite numbers as they are, anything else ("nan", "inf", null) as NaN."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return math.nan


def _text_as_float(text: str) -> float:
    """A value read as JSON text (`values ->> name`): a number, or the engine's "nan"/"inf"/"-inf"."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def _floats(values: list[Any]) -> np.ndarray:
    """Metric values as float64, NaN for anything not finite (numpy parses the "nan"/"inf" strings)."""
    try:
        out = np.array(values, dtype=_DTYPE)
    except (TypeError, ValueError):
        out = np.array([_as_float(v) for v in values], dtype=_DTYPE)
    out[~np.isfinite(out)] = np.nan
    return out
