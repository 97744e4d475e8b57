"""Metric series at scale: a column store of each run's metrics (MetricBlock), the run summary, and
server-side downsampling for charts.

Writes. The newest metrics events of a run stay in their MetricRows (the "tail"). Once the tail holds
BLOCK_POINTS events, `append_metrics` seals them into one MetricBlock per metric, under the run's row
lock, in the ingesting transaction. When the run ends, `seal_tail` seals what is left, however short.
A block is written once and never updated. So a batch costs the same at step 10 as at step 10
million, and the run summary (`Run.summary`: per metric last, step, min, max, count) is updated from
the batch alone.

Reads. `read_series` makes three queries whatever the number of runs and metrics (four when it reads
overviews, below): each run's seal point, the blocks up to it, and the tail after it. It returns numpy
arrays in step order, which `runs_series` turns into chart payloads on one of the X_AXES. Non-finite
values are NaN in the store and `null` in the payload, so a chart shows a gap at that step.

Downsampling is M4 (Jugel et al., "M4: a visualization-oriented time series data aggregation",
VLDB 2014). The x range is cut into equal buckets, and each bucket keeps its first and last point,
its minimum and its maximum, in x order. A line chart drawn from those points has the same pixels as
one drawn from every point, when there are as many buckets as pixel columns. So every spike
survives, and so do the first and last points of the series. M4 is also a few vectorised numpy
passes per series, O(n). LTTB keeps one point per bucket, picked by triangle area. It can drop one
side of a noisy bucket's range, and it is a sequential loop. A bucket that holds non-finite values
also keeps its first non-finite point, so the gap shows at the right place instead of vanishing.

Overviews. A sealed block also keeps its overview: M4 of each run of OVERVIEW_BUCKET_POINTS (64)
consecutive points, at most 5 points of every 64. A chart whose M4 buckets span at least two overview
buckets (a run of 32 x max_points points or more) reads the overviews instead of every point: 16 times
fewer bytes, and M4 of the overviews keeps the same first and last points and the same minimum and
maximum of every overview bucket. A bucket edge may fall inside an overview bucket, so a point can land
one pixel column over; `points` still counts every stored point. The progress metric that places points
on the samples and tokens axes is always read whole (each point's x is its exact value at that step).
The choice is per run and metric, from the run summary's point count.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import Any

import numpy as np
from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import Max, OuterRef, Q, QuerySet, Subquery
from django.db.models.fields.json import KeyTextTransform

from posttrain.runs.models import Run
from posttrain.telemetry.models import MetricBlock, MetricRow

BLOCK_POINTS = 1024  # metrics events sealed together: a block holds at most this many points of its metric
OVERVIEW_BUCKET_POINTS = 64  # consecutive points of a block that its overview reduces to at most 5
# A chart reads overviews once each of its M4 buckets (max_points / 4 of them) spans two overview buckets.
OVERVIEW_MIN_POINTS_PER_MAX_POINT = 2 * OVERVIEW_BUCKET_POINTS // 4
X_AXES = ("step", "samples", "tokens", "time")
# The x axes read from a cumulative progress metric: a point's x is its value at the point's step.
PROGRESS_METRICS = {"samples": "progress/samples", "tokens": "progress/tokens"}
DEFAULT_MAX_POINTS = 1500
MIN_MAX_POINTS, MAX_MAX_POINTS = 10, 20_000
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


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _finite_min_max(values: np.ndarray) -> tuple[float | None, float | None]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return None, None
    return float(finite.min()), float(finite.max())


def _merge_min(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _merge_max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


# =============================================================================================
# Writes
# =============================================================================================


@dataclass
class _Points:
    """The points of one metric among some events, in seq order."""

    steps: np.ndarray
    values: np.ndarray
    times: np.ndarray


def _floats(values: list[Any]) -> np.ndarray:
    """Metric values as float64, NaN for anything not finite (numpy parses the "nan"/"inf" strings)."""
    try:
        out = np.array(values, dtype=_DTYPE)
    except (TypeError, ValueError):
        out = np.array([_as_float(v) for v in values], dtype=_DTYPE)
    out[~np.isfinite(out)] = np.nan
    return out


def _points_by_name(events: Sequence[dict[str, Any]]) -> dict[str, _Points]:
    # Column by column: a sealed chunk is ~1000 events x dozens of metrics, so per-value Python work counts.
    names = dict.fromkeys(name for event in events for name in event["data"])
    steps = np.array([event["step"] for event in events], dtype=_DTYPE)
    times = np.array([event["time"] for event in events], dtype=_DTYPE)
    points = {}
    for name in names:
        raw = [event["data"].get(name) for event in events]
        if None in raw:  # null reads as "not logged", as a missing key does (MetricRow tail reads)
            logged = [i for i, value in enumerate(raw) if value is not None]
            if not logged:
                continue
            points[name] = _Points(steps[logged], _floats([raw[i] for i in logged]), times[logged])
        else:
            points[name] = _Points(steps, _floats(raw), times)
    return points


def summary_with(summary: dict[str, Any], events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run summary with these metrics events (in seq order) added; `last` is the latest event's value."""
    merged = dict(summary)
    for name, p in _points_by_name(events).items():
        old = merged.get(name) or {}
        low, high = _finite_min_max(p.values)
        merged[name] = {
            "last": _finite_or_none(p.values[-1]),
            "step": int(p.steps[-1]),
            "min": _merge_min(old.get("min"), low),
            "max": _merge_max(old.get("max"), high),
            "count": int(old.get("count", 0)) + int(p.values.size),
        }
    return merged


def block_overview(steps: np.ndarray, values: np.ndarray, times: np.ndarray) -> tuple[bytes, bytes, bytes]:
    """(steps, values, times) packed, of the points M4 keeps of each OVERVIEW_BUCKET_POINTS consecutive
    points of a block (its first and last, minimum, maximum and first non-finite point)."""
    n = int(values.size)
    per_bucket = 4 if bool(np.isfinite(values).all()) else 5
    buckets = -(-n // OVERVIEW_BUCKET_POINTS)
    keep = m4_indices(np.arange(n, dtype=_DTYPE), values, buckets * per_bucket)
    return _pack(steps[keep]), _pack(values[keep]), _pack(times[keep])


def seal_chunk(
    run_id: RunId, events: Sequence[dict[str, Any]], *, block_model: type[MetricBlock] = MetricBlock
) -> None:
    """One block per metric of a chunk of consecutive metrics events (seq order, at most BLOCK_POINTS),
    each numbered after that metric's last block; all of them cover the run through the chunk's last seq."""
    points = _points_by_name(events)
    if not points:
        return
    last_index = dict(
        block_model.objects.filter(run_id=run_id, name__in=list(points))
        .order_by()
        .values("name")
        .annotate(top=Max("index"))
        .values_list("name", "top")
    )
    through_seq = events[-1]["seq"]
    # A migration's historical model from before overviews existed (0015 fills them in afterwards).
    with_overview = any(f.name == "overview_values" for f in block_model._meta.get_fields())
    blocks = []
    for name, p in points.items():
        low, high = _finite_min_max(p.values)
        overview = (
            dict(
                zip(("overview_steps", "overview_values", "overview_times"), block_overview(p.steps, p.values, p.times))
            )
            if with_overview
            else {}
        )
        blocks.append(
            block_model(
                run_id=run_id,
                name=name,
                index=last_index.get(name, -1) + 1,
                through_seq=through_seq,
                count=int(p.values.size),
                first_step=int(p.steps[0]),
                last_step=int(p.steps[-1]),
                min=low,
                max=high,
                steps=_pack(p.steps),
                values=_pack(p.values),
                times=_pack(p.times),
                **overview,
            )
        )
    block_model.objects.bulk_create(blocks)


def seal_tail(run_id: RunId) -> None:
    """Seals the run's unsealed tail however short it is: a run that ended gets no more points, and its
    charts then read blocks (and overviews) only. Call under the run's row lock, as ingestion does."""
    rows = _tail_events(run_id, _sealed_through(run_id, MetricBlock))
    for start in range(0, len(rows), BLOCK_POINTS):
        seal_chunk(run_id, rows[start : start + BLOCK_POINTS])


def _tail_events(run_id: RunId, sealed: int) -> list[dict[str, Any]]:
    """The run's metrics events after `sealed`, in seq order, as seal_chunk takes them."""
    tail = MetricRow.objects.filter(run_id=run_id, seq__gt=sealed).order_by("seq")
    return [
        {"seq": seq, "step": step, "time": time, "data": values}
        for seq, step, time, values in tail.values_list("seq", "step", "time", "values")
    ]


def _sealed_through(run_id: RunId, block_model: type[MetricBlock]) -> int:
    return block_model.objects.filter(run_id=run_id).aggregate(top=Max("through_seq"))["top"] or 0


def append_metrics(run_id: RunId, summary: dict[str, Any], events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Called by ingestion once a batch's MetricRows are inserted, under the run's row lock. Returns
    the summary with the batch's `metrics` events (seq order); seals the run's tail of MetricRows into
    blocks, BLOCK_POINTS events at a time, once it is that long.

    Blocks are written once: no batch rewrites stored points. The obvious alternative, appending to a
    partly filled block per metric, rewrote ~BLOCK_POINTS/2 points per metric on every batch and made
    ingestion 3-6x slower in our measurements; sealing costs ~20% (see bench/README.md)."""
    if not events:
        return summary
    sealed = _sealed_through(run_id, MetricBlock)
    # seqs are unique: fewer than BLOCK_POINTS seqs after the seal cannot hold BLOCK_POINTS events
    if (
        events[-1]["seq"] - sealed >= BLOCK_POINTS
        and MetricRow.objects.filter(run_id=run_id, seq__gt=sealed).count() >= BLOCK_POINTS
    ):
        rows = _tail_events(run_id, sealed)
        for start in range(0, len(rows) - BLOCK_POINTS + 1, BLOCK_POINTS):
            seal_chunk(run_id, rows[start : start + BLOCK_POINTS])
    return summary_with(summary, events)


# =============================================================================================
# Reads
# =============================================================================================


@dataclass
class Series:
    """One metric of one run in step order (points of the same step stay in seq order)."""

    steps: np.ndarray  # float64 holding integers
    values: np.ndarray  # NaN = not finite
    times: np.ndarray | None  # event times, when asked for
    stored: int | None = None  # every stored point, when these arrays hold the blocks' overviews

    @property
    def size(self) -> int:
        return int(self.values.size)

    @property
    def points(self) -> int:
        """How many points the run stored (the overview's arrays hold fewer)."""
        return self.size if self.stored is None else self.stored


@dataclass
class _RunMarks:
    sealed: int  # metrics events up to this seq are in blocks, later ones in the MetricRow tail
    first_time: float | None  # time of the first metrics event: the origin of the time axis


def _run_marks(run_ids: Sequence[RunId]) -> dict[str, _RunMarks]:
    sealed = MetricBlock.objects.filter(run=OuterRef("pk")).order_by("-through_seq").values("through_seq")[:1]
    first = MetricRow.objects.filter(run=OuterRef("pk")).order_by("seq").values("time")[:1]
    rows = (
        Run.objects.filter(pk__in=list(run_ids))
        .order_by()
        .annotate(sealed=Subquery(sealed), t0=Subquery(first))
        .values_list("pk", "sealed", "t0")
    )
    return {str(pk): _RunMarks(sealed or 0, t0) for pk, sealed, t0 in rows}


def _fetch(queryset: QuerySet) -> Iterable[tuple]:
    """The rows of a values_list queryset. On Postgres they come in the binary protocol: bytea arrives
    as stored instead of doubled into hex text, which was 2/3 of a 10-run compare request's time."""
    if connection.vendor != "postgresql":
        return queryset
    from psycopg import Cursor  # Django's own cursors bind client-side, where results are text only

    try:
        sql, params = queryset.query.sql_with_params()
    except EmptyResultSet:  # e.g. none of the runs exists any more
        return []
    connection.ensure_connection()
    with Cursor(connection.connection) as cursor:
        cursor.execute(sql, params, binary=True)
        return cursor.fetchall()


def _any_of(conditions: Iterable[Q]) -> Q:
    combined = Q(pk__in=[])
    for condition in conditions:
        combined |= condition
    return combined


def _read_tail_arrays(
    marks: dict[str, _RunMarks],
    names: list[str],
    chunks: dict[tuple[str, str], list[list[np.ndarray]]],
    last_seq: dict[str, int],
) -> None:
    """The unsealed tail as arrays built in Postgres: one row per run with each metric's steps, values and
    times aggregated in seq order, so an unsealed point costs what a sealed one does (no Python per
    point). Non-finite values arrive as the engine's "nan"/"inf" text, which float8 reads."""
    if not marks or not names:
        return
    conditions, params = [], []
    for run_id, mark in marks.items():
        conditions.append("(run_id = %s AND seq > %s)")
        params += [uuid.UUID(str(run_id)), mark.sealed]
    columns = ["max(seq)"]
    name_params: list[Any] = []
    for name in names:
        logged = 'FILTER (WHERE ("values" ->> %s) IS NOT NULL)'
        for expression in ("step::float8", '("values" ->> %s)::float8', '"time"'):
            columns.append(f"array_agg({expression} ORDER BY seq) {logged}")
            name_params += ([name] if "%s" in expression else []) + [name]
    table = MetricRow._meta.db_table
    sql = f"SELECT run_id, {', '.join(columns)} FROM {table} WHERE {' OR '.join(conditions)} GROUP BY run_id"
    from psycopg import Cursor

    connection.ensure_connection()
    with Cursor(connection.connection) as cursor:
        cursor.execute(sql, name_params + params, binary=True)
        rows = cursor.fetchall()
    for run_uuid, top, *arrays in rows:
        run_id = str(run_uuid)
        last_seq[run_id] = max(last_seq[run_id], top)
        for i, name in enumerate(names):
            steps, values, times = arrays[3 * i : 3 * i + 3]
            if steps:
                chunks.setdefault((run_id, name), []).append(
                    [np.asarray(steps, dtype=_DTYPE), _floats(values), np.asarray(times, dtype=_DTYPE)]
                )


def _read_tail_rows(
    marks: dict[str, _RunMarks],
    names: list[str],
    chunks: dict[tuple[str, str], list[list[np.ndarray]]],
    last_seq: dict[str, int],
) -> None:
    """The unsealed tail row by row (SQLite: the embedded default, at demo size)."""
    # ->> (text): a float() per value beats Django decoding each jsonb value as a JSON document
    keys = {f"m{i}": KeyTextTransform(name, "values") for i, name in enumerate(names)}
    tail = (
        MetricRow.objects.filter(_any_of(Q(run_id=r, seq__gt=mark.sealed) for r, mark in marks.items()))
        .order_by("run_id", "seq")
        .annotate(**keys)
        .values_list("run_id", "seq", "step", "time", *keys)
    )
    for run_uuid, grouped in groupby(_fetch(tail), key=itemgetter(0)):
        rows = list(grouped)
        run_id = str(run_uuid)
        last_seq[run_id] = max(last_seq[run_id], rows[-1][1])
        for i, name in enumerate(names, start=4):
            logged = [row for row in rows if row[i] is not None]  # null: the event has no such metric
            if logged:
                chunks.setdefault((run_id, name), []).append(
                    [
                        np.array([row[2] for row in logged], dtype=_DTYPE),
                        np.array([_text_as_float(row[i]) for row in logged], dtype=_DTYPE),
                        np.array([row[3] for row in logged], dtype=_DTYPE),
                    ]
                )


def _read_blocks(
    wanted: dict[str, tuple[int, list[str]]],
    with_times: bool,
    overview: bool,
    chunks: dict[tuple[str, str], list[list[np.ndarray]]],
    skipped: dict[tuple[str, str], int],
) -> None:
    """The sealed blocks' arrays of {run id: (sealed through seq, names)}, or their overviews (`skipped`
    then counts the points the overviews leave out)."""
    wanted = {r: (sealed, names) for r, (sealed, names) in wanted.items() if sealed and names}
    if not wanted:
        return
    prefix = "overview_" if overview else ""
    fields = [f"{prefix}steps", f"{prefix}values"] + ([f"{prefix}times"] if with_times else [])
    rows: Iterable[tuple]
    if connection.vendor == "postgresql":
        rows = _joined_blocks_postgres(wanted, fields)
    else:
        condition = _any_of(
            Q(run_id=r, through_seq__lte=sealed, name__in=names) for r, (sealed, names) in wanted.items()
        )
        blocks = MetricBlock.objects.filter(condition).order_by("run_id", "name", "index")
        rows = _fetch(blocks.values_list("run_id", "name", "count", *fields))
    for run_id, name, count, *raw in rows:
        arrays = [_unpack(r) for r in raw]
        key = (str(run_id), name)
        chunks.setdefault(key, []).append(arrays)
        if overview:
            skipped[key] = skipped.get(key, 0) + int(count) - int(arrays[0].size)


def _joined_blocks_postgres(wanted: dict[str, tuple[int, list[str]]], fields: list[str]) -> list[tuple]:
    """One row per (run, metric): its blocks' arrays joined in Postgres in block order (string_agg of the
    bytea), and their point count. A hundred runs' series arrive as a few hundred byte strings instead of
    ten thousand rows of arrays."""
    from psycopg import Cursor

    run_ids, sealed, names = [], [], []
    for run_id, (through, run_names) in wanted.items():
        for name in run_names:
            run_ids.append(uuid.UUID(str(run_id)))
            sealed.append(through)
            names.append(name)
    joined = ", ".join(f"string_agg(b.{f}, ''::bytea ORDER BY b.index)" for f in fields)
    table = MetricBlock._meta.db_table
    sql = (
        f"SELECT b.run_id, b.name, sum(b.count), {joined} FROM {table} b "
        "JOIN unnest(%s::uuid[], %s::bigint[], %s::text[]) AS w(run_id, sealed, name) "
        "ON b.run_id = w.run_id AND b.name = w.name AND b.through_seq <= w.sealed "
        "GROUP BY b.run_id, b.name"
    )
    connection.ensure_connection()
    with Cursor(connection.connection) as cursor:
        cursor.execute(sql, [run_ids, sealed, names], binary=True)
        return cursor.fetchall()


def read_series(
    run_ids: Sequence[RunId],
    names: Sequence[str],
    *,
    with_times: bool = False,
    overview: Collection[tuple[str, str]] = (),
) -> tuple[dict[tuple[str, str], Series], dict[str, int], dict[str, float | None]]:
    """({(run id, name): Series} of the metrics with points, {run id: highest metrics seq read},
    {run id: time of its first metrics event}). For the (run id, name) pairs in `overview`, the sealed
    blocks' overviews instead of their points (the unsealed tail is read whole).

    Three queries whatever the number of runs and names (four with overviews): each run's seal point,
    the blocks up to it, and the MetricRow tail after it. A seal committed meanwhile cannot make a point
    count twice."""
    names = list(names)
    marks = _run_marks(run_ids)
    chunks: dict[tuple[str, str], list[list[np.ndarray]]] = {}
    skipped: dict[tuple[str, str], int] = {}
    pairs = {(str(r), n) for r, n in overview}
    for reduced in (False, True):
        wanted = {
            run_id: (mark.sealed, [n for n in names if ((run_id, n) in pairs) == reduced])
            for run_id, mark in marks.items()
        }
        _read_blocks(wanted, with_times, reduced, chunks, skipped)

    last_seq = {run_id: mark.sealed for run_id, mark in marks.items()}
    if connection.vendor == "postgresql":
        _read_tail_arrays(marks, names, chunks, last_seq)
    else:
        _read_tail_rows(marks, names, chunks, last_seq)

    series = {}
    for key, parts in chunks.items():
        steps = np.concatenate([part[0] for part in parts])
        values = np.concatenate([part[1] for part in parts])
        times = np.concatenate([part[2] for part in parts]) if with_times else None
        if steps.size > 1 and bool((steps[1:] < steps[:-1]).any()):  # a step re-sent later (a resume)
            order = np.argsort(steps, kind="stable")
            steps, values = steps[order], values[order]
            times = times[order] if times is not None else None
        series[key] = Series(steps, values, times, stored=steps.size + skipped[key] if key in skipped else None)
    return series, last_seq, {run_id: mark.first_time for run_id, mark in marks.items()}


def progress_x(steps: np.ndarray, progress: Series | None) -> np.ndarray:
    """The value of a cumulative progress metric at each step: the last finite value logged at or
    before it (an eval logged at a step of its own still lands on the curve); NaN before the first."""
    if progress is None:
        return np.full(steps.shape, np.nan)
    finite = np.isfinite(progress.values)
    known_steps, known = progress.steps[finite], progress.values[finite]
    at = np.searchsorted(known_steps, steps, side="right") - 1
    return np.where(at >= 0, known[np.clip(at, 0, None)], np.nan)


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


# =============================================================================================
# Export: the raw event log, every metric of every step
# =============================================================================================

EXPORT_CHUNK_ROWS = 2000
_FILENAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.#() -]+")


def _export_rows(run: Run):
    """The run's metrics events in step order, up to the run's last_seq as read with its summary (the
    CSV header): events stored while the download streams are left out, not half-described."""
    return (
        MetricRow.objects.filter(run_id=run.pk, seq__lte=run.last_seq)
        .order_by("step", "seq")
        .values_list("step", "time", "values")
        .iterator(chunk_size=EXPORT_CHUNK_ROWS)
    )


def _csv_cell(value: Any) -> Any:
    """Numbers as Python writes them (shortest round trip); the engine's "nan"/"inf" strings as they are."""
    return "" if value is None else value


def metric_rows_csv(run: Run) -> Iterator[str]:
    """`step,time,<every metric name sorted>` then one line per metrics event; empty where a step has no value."""
    run.refresh_from_db(fields=["last_seq", "summary"])
    names = sorted(run.summary)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["step", "time", *names])
    for i, (step, time, values) in enumerate(_export_rows(run), start=1):
        writer.writerow([step, time, *(_csv_cell(values.get(name)) for name in names)])
        if i % EXPORT_CHUNK_ROWS == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


def metric_rows_jsonl(run: Run) -> Iterator[str]:
    """One `{"step", "time", "values"}` per line, values as stored ("nan"/"inf" strings included)."""
    run.refresh_from_db(fields=["last_seq"])
    lines: list[str] = []
    for step, time, values in _export_rows(run):
        lines.append(json.dumps({"step": step, "time": time, "values": values}, separators=(",", ":")) + "\n")
        if len(lines) == EXPORT_CHUNK_ROWS:
            yield "".join(lines)
            lines = []
    yield "".join(lines)


EXPORT_FORMATS: dict[str, tuple[str, Callable[[Run], Iterator[str]]]] = {
    "csv": ("text/csv; charset=utf-8", metric_rows_csv),
    "jsonl": ("application/x-ndjson; charset=utf-8", metric_rows_jsonl),
}


def export_filename(run: Run, kind: str) -> str:
    stem = _FILENAME_UNSAFE.sub("_", run.name).strip(" _") or str(run.pk)
    return f"{stem}-metrics.{kind}"
