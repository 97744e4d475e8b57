"""Writes: the run summary, and sealing the MetricRow tail into write-once blocks (with their overviews)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db.models import Max

from posttrain.telemetry.models import MetricBlock, MetricRow
from posttrain.telemetry.series.arrays import _DTYPE, RunId, _floats, _pack
from posttrain.telemetry.series.m4 import m4_indices

BLOCK_POINTS = 1024  # metrics events sealed together: a block holds at most this many points of its metric
OVERVIEW_BUCKET_POINTS = 64  # consecutive points of a block that its overview reduces to at most 5


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


@dataclass
class _Points:
    """The points of one metric among some events, in seq order."""

    steps: np.ndarray
    values: np.ndarray
    times: np.ndarray


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
