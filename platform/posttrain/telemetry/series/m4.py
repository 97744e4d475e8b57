"""M4 downsampling (the package docstring says why M4): the indices of the points a chart keeps."""

from __future__ import annotations

import numpy as np


def m4_indices(x: np.ndarray, y: np.ndarray, max_points: int) -> np.ndarray:
    """Indices of the points M4 keeps (sorted), at most `max_points` of them.

    x is cut into equal buckets of its range. When x goes backwards somewhere, the buckets hold
    equal numbers of points instead, because a bucket must be a contiguous run of points. Each bucket
    keeps its first and last point (finite or not), the first point with its minimum and the first
    with its maximum (over finite values), and its first non-finite point. A bucket keeps at most 4
    points, or 5 when the series has gaps."""
    n = int(y.size)
    if n <= max_points:
        return np.arange(n)
    finite = np.isfinite(y)
    per_bucket = 4 if finite.all() else 5
    buckets = max(1, max_points // per_bucket)
    span = float(x[-1] - x[0]) if n else 0.0
    if bool((x[1:] >= x[:-1]).all()) and span > 0:
        # multiply before dividing: integer steps land on exact bucket edges
        bucket = np.minimum(((x - x[0]) * buckets / span).astype(np.int64), buckets - 1)
    else:
        bucket = np.arange(n, dtype=np.int64) * buckets // n
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    sizes = np.diff(np.r_[starts, n])

    def first_per_bucket(candidates: np.ndarray) -> np.ndarray:
        b = bucket[candidates]
        return candidates[np.r_[True, b[1:] != b[:-1]]] if candidates.size else candidates

    low = np.where(finite, y, np.inf)
    high = np.where(finite, y, -np.inf)
    lows = np.repeat(np.minimum.reduceat(low, starts), sizes)
    highs = np.repeat(np.maximum.reduceat(high, starts), sizes)
    keep = np.zeros(n, dtype=bool)  # a mask, not np.unique: sorted and deduplicated in one pass
    for kept in (
        starts,
        starts + sizes - 1,
        first_per_bucket(np.flatnonzero(finite & (low == lows))),
        first_per_bucket(np.flatnonzero(finite & (high == highs))),
        first_per_bucket(np.flatnonzero(~finite)),
    ):
        keep[kept] = True
    return np.flatnonzero(keep)
