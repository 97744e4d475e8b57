"""Reads: a run's series as numpy arrays, from its sealed blocks (or their overviews) and its unsealed tail."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import Any

import numpy as np
from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.db.models.fields.json import KeyTextTransform

from posttrain.runs.models import Run
from posttrain.telemetry.models import MetricBlock, MetricRow
from posttrain.telemetry.series.arrays import _DTYPE, RunId, _floats, _text_as_float, _unpack


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
