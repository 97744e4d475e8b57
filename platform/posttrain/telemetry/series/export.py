"""Export: the raw event log, every metric of every step (CSV or JSON lines), streamed."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from posttrain.runs.models import Run
from posttrain.telemetry.models import MetricRow

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
