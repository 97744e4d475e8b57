"""Chart payloads: a run's series placed on one of the X_AXES and downsampled to a chart's points."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from posttrain.runs.models import Run
from posttrain.telemetry.series.m4 import m4_indices
from posttrain.telemetry.series.reading import Series, read_series
from posttrain.telemetry.series.sealing import OVERVIEW_BUCKET_POINTS

# A chart reads overviews once each of its M4 buckets (max_points / 4 of them) spans two overview buckets.
OVERVIEW_MIN_POINTS_PER_MAX_POINT = 2 * OVERVIEW_BUCKET_POINTS // 4
X_AXES = ("step", "samples", "tokens", "time")
# The x axes read from a cumulative progress metric: a point's x is its value at the point's step.
PROGRESS_METRICS = {"samples": "progress/samples", "tokens": "progress/tokens"}
DEFAULT_MAX_POINTS = 1500
MIN_MAX_POINTS, MAX_MAX_POINTS = 10, 20_000


def progress_x(steps: np.ndarray, progress: Series | None) -> np.ndarray:
    """The value of a cumulative progress metric at each step: the last finite value logged at or
    before it (an eval logged at a step of its own still lands on the curve); NaN before the first."""
    if progress is None:
        return np.full(steps.shape, np.nan)
    finite = np.isfinite(progress.values)
    known_steps, known = progress.steps[finite], progress.values[finite]
    at = np.searchsorted(known_steps, steps, side="right") - 1
    return np.where(at >= 0, known[np.clip(at, 0, None)], np.nan)


def _numbers(values: np.ndarray) -> list[float | None]:
    """JSON numbers, null where not finite."""
    numbers: list[float | None] = values.tolist()
    for i in np.flatnonzero(~np.isfinite(values)).tolist():
        numbers[i] = None
    return numbers


def _integers(values: np.ndarray) -> list[int]:
    return np.rint(values).astype(np.int64).tolist()


def chart_series(
    series: Series | None, x_axis: str, max_points: int, *, progress: Series | None = None, t0: float | None = None
) -> dict[str, Any]:
    """{"x", "y", "step", "points", "downsampled"} of one metric on `x_axis` (one of X_AXES).

    `points` counts every stored point. On the samples and tokens axes, points logged before the
    first progress value have no x and are left out. On the time axis, x is seconds since `t0`."""
    if series is None or series.size == 0:
        return {"x": [], "y": [], "step": [], "points": 0, "downsampled": False}
    steps, values = series.steps, series.values
    if x_axis == "step":
        x = steps
    elif x_axis == "time":
        times = series.times
        assert times is not None  # series for the time axis are read with their times (runs_series)
        x = times - (t0 if t0 is not None else times[0])
    else:
        x = progress_x(steps, progress)
        placed = np.isfinite(x)
        if not placed.all():
            x, steps, values = x[placed], steps[placed], values[placed]
    keep = m4_indices(x, values, max_points)
    downsampled = keep.size < values.size or series.points > series.size  # M4, or overviews read
    if keep.size < values.size:
        x, steps, values = x[keep], steps[keep], values[keep]
    return {
        "x": np.round(x, 3).tolist() if x_axis == "time" else _integers(x),
        "y": _numbers(values),
        "step": _integers(steps),
        "points": series.points,
        "downsampled": bool(downsampled),
    }


def metric_names(summaries: Iterable[dict[str, Any]]) -> list[str]:
    """Every metric name of the given run summaries, sorted."""
    return sorted({name for summary in summaries for name in summary})


@dataclass
class RunSeries:
    last_seq: int  # highest seq of a metrics event read: live events after it extend the curves
    series: dict[str, dict[str, Any]]


def overview_pairs(runs: Sequence[Run], names: Sequence[str], max_points: int) -> list[tuple[str, str]]:
    """The (run id, name) pairs with enough points (the run summary's count) for a chart of `max_points`
    to read their overviews."""
    pairs = []
    for run in runs:
        summary = run.summary if isinstance(run.summary, dict) else {}
        for name in names:
            if int((summary.get(name) or {}).get("count") or 0) >= OVERVIEW_MIN_POINTS_PER_MAX_POINT * max_points:
                pairs.append((str(run.pk), name))
    return pairs


def runs_series(
    runs: Sequence[Run],
    names: Sequence[str] | None,
    x_axis: str,
    max_points: int,
) -> dict[str, RunSeries]:
    """{run id: RunSeries} of the named metrics (default: all the runs have) on `x_axis`."""
    if x_axis not in X_AXES:
        raise ValueError(f"unknown x axis {x_axis!r}")
    names = list(names) if names else metric_names(run.summary for run in runs)
    progress_name = PROGRESS_METRICS.get(x_axis)
    run_ids = [str(run.pk) for run in runs]
    # The progress metric places points on its axis: read whole, never as an overview.
    overview = overview_pairs(runs, [n for n in names if n != progress_name], max_points)
    wanted = [*names, progress_name] if progress_name and progress_name not in names else names
    found, last_seq, t0 = read_series(run_ids, wanted, with_times=x_axis == "time", overview=overview)
    out = {}
    for run_id in run_ids:
        progress = found.get((run_id, progress_name)) if progress_name else None
        out[run_id] = RunSeries(
            last_seq=last_seq.get(run_id, 0),
            series={
                name: chart_series(found.get((run_id, name)), x_axis, max_points, progress=progress, t0=t0.get(run_id))
                for name in names
            },
        )
    return out
