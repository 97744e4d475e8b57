"""Validating and summarising a prompt dataset file (JSONL, CSV or Parquet) in one streaming pass.

The rules match what the engine's loader (rl_engine/data.py) needs, so a dataset accepted here
never fails at the start of a run: every row has the prompt field as a non-empty string and, when
a label field is mapped, the label field. Errors name the line (JSONL, CSV: the line an editor
shows) or the row (Parquet, 1-based) and the field. A file the user uploaded may be quoted back to them
(its column names); a file registered from the server (`quote=False`) never is: its errors name the field
and the rule, and count what they would otherwise list.

Files are read line by line or batch by batch from disk, never whole into memory.
"""

from __future__ import annotations

import codecs
import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMATS: tuple[str, ...] = ("jsonl", "csv", "parquet")
EXTENSIONS = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
PREVIEW_ROWS = 20
# A preview is for reading in the browser: cut long values so a dataset of book-length prompts
# does not put megabytes into one database row.
PREVIEW_MAX_CHARS = 2000
SPLIT_COLUMN = "split"
DEFAULT_SPLIT = "train"
PARQUET_BATCH_ROWS = 4096


class DatasetError(ValueError):
    """A dataset problem: `field` is the input to fix (file, format, prompt_field, label_field)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass
class DatasetSummary:
    row_count: int = 0
    columns: list[str] = field(default_factory=list)
    splits: dict[str, int] = field(default_factory=dict)
    preview: list[dict[str, Any]] = field(default_factory=list)


def detect_format(filename: str, given: str | None) -> str:
    """The format asked for, else the one the file extension says."""
    if given:
        fmt = given.strip().lower()
        if fmt not in FORMATS:
            raise DatasetError("format", f"unknown format {given!r}; expected one of: {', '.join(FORMATS)}")
        return fmt
    suffix = Path(filename or "").suffix.lower()
    if suffix not in EXTENSIONS:
        raise DatasetError(
            "format",
            f"cannot tell the format of {Path(filename or '').name or 'the file'!r} from its extension; "
            f"name it .jsonl, .csv or .parquet or give format ({', '.join(FORMATS)})",
        )
    return EXTENSIONS[suffix]


def inspect_dataset(path: Path, fmt: str, prompt_field: str, label_field: str, *, quote: bool = True) -> DatasetSummary:
    """Validate every row of the file and return its row count, columns, splits and preview. `quote`: whether
    errors may show the file's own column names (an upload, the user's own file), or only count them."""
    if path.stat().st_size == 0:
        raise DatasetError("file", "the file is empty")
    rows = {"jsonl": _jsonl_rows, "csv": _csv_rows, "parquet": _parquet_rows}[fmt]
    collector = _Collector(prompt_field, label_field, quote)
    for where, row in rows(path, collector):
        collector.add(where, row)
    if collector.summary.row_count == 0:
        raise DatasetError("file", "the file has no rows" + (" after the header" if fmt == "csv" else ""))
    return collector.summary


# --- per-row rules ----------------------------------------------------------------------------


class _Collector:
    def __init__(self, prompt_field: str, label_field: str, quote: bool = True):
        self.prompt_field = prompt_field
        self.label_field = label_field
        self.quote = quote
        self.summary = DatasetSummary()
        self._columns: dict[str, None] = {}  # ordered set

    def check_columns(self, columns: list[str], where: str, hint: str = "") -> None:
        """For formats with a schema (CSV header, Parquet): a wrong mapping is found before any row."""
        for name, value in (("prompt_field", self.prompt_field), ("label_field", self.label_field)):
            if value and value not in columns:
                raise DatasetError(
                    name,
                    f"column {value!r} is not in {where} ({self.names(columns)}){hint}; set {name} to the column to use",
                )
        for column in columns:
            self._columns.setdefault(_text(column), None)
        self.summary.columns = list(self._columns)

    def add(self, where: str, row: dict[str, Any]) -> None:
        first = self.summary.row_count == 0
        prompt = self._require(where, row, self.prompt_field, "prompt_field", first)
        if not isinstance(prompt, str):
            raise DatasetError(
                "file", f"{where}: field {self.prompt_field!r} must be a string, got {_json_type(prompt)}"
            )
        if not prompt.strip():
            raise DatasetError("file", f"{where}: field {self.prompt_field!r} is empty")
        if self.label_field:
            self._require(where, row, self.label_field, "label_field", first)
        self.summary.row_count += 1
        known = len(self._columns)
        for key in row:
            self._columns.setdefault(_text(key), None)
        if len(self._columns) != known:
            self.summary.columns = list(self._columns)
        split = row.get(SPLIT_COLUMN)
        # A row without a split value is training data: the engine trains on every row.
        split_name = DEFAULT_SPLIT if split is None or split == "" else _text(split)[:200]
        self.summary.splits[split_name] = self.summary.splits.get(split_name, 0) + 1
        if len(self.summary.preview) < PREVIEW_ROWS:
            self.summary.preview.append({_text(k): _preview_value(v) for k, v in row.items()})

    def _require(self, where: str, row: dict[str, Any], name: str, mapping: str, first: bool) -> Any:
        if name in row:
            return row[name]
        if first:
            # Missing from the very first row: most likely the mapping is wrong, not the data.
            raise DatasetError(
                mapping,
                f"{where}: field {name!r} is missing (the row has: {self.names(list(row))}); set {mapping} to the field to use",
            )
        raise DatasetError("file", f"{where}: field {name!r} is missing")

    def names(self, columns: list[str]) -> str:
        """The columns as an error may show them: by name for the user's own file, else only how many."""
        if self.quote:
            return _names(columns)
        return f"{len(columns)} field{'s' if len(columns) != 1 else ''}, not shown for a file on the server"


# --- readers ----------------------------------------------------------------------------------


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line, decoded strictly; a bad byte names its line and offset."""
    offset = 0
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                # The engine reads with encoding="utf-8", which keeps the BOM as part of the first
                # key or value; refusing it here beats a confusing error at run time.
                raise DatasetError(
                    "file", "line 1: the file starts with a byte order mark (BOM); save it as UTF-8 without BOM"
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(
                    "file",
                    f"line {number}: not valid UTF-8 (byte offset {offset + exc.start}: {exc.reason}); save the file as UTF-8",
                ) from None
            offset += len(raw)
            yield number, text


def _jsonl_rows(path: Path, collector: _Collector) -> Iterator[tuple[str, dict[str, Any]]]:
    for number, text in _lines(path):
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError("file", f"line {number}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise DatasetError("file", f"line {number}: the JSON is nested too deeply") from None
        if not isinstance(value, dict):
            raise DatasetError("file", f"line {number}: expected a JSON object, got {_json_type(value)}")
        yield f"line {number}", value


def _csv_rows(path: Path, collector: _Collector) -> Iterator[tuple[str, dict[str, Any]]]:
    for _ in _lines(path):  # encoding first, with line and byte offset (csv would only say "invalid")
        pass
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if not header:
                raise DatasetError("file", "line 1: the CSV header is missing (the first line must name the columns)")
            _check_header(header, collector.quote)
            collector.check_columns(header, "the CSV header", " (is the first line a header naming the columns?)")
            for record in reader:
                if not record:
                    continue  # a blank line
                if len(record) != len(header):
                    raise DatasetError(
                        "file", f"line {reader.line_num}: has {len(record)} fields, the header has {len(header)}"
                    )
                yield f"line {reader.line_num}", dict(zip(header, record))
        except csv.Error as exc:
            raise DatasetError("file", f"line {reader.line_num}: not valid CSV ({exc})") from None


def _check_header(header: list[str], quote: bool = True) -> None:
    seen: dict[str, int] = {}
    for position, name in enumerate(header, start=1):
        if not name.strip():
            raise DatasetError("file", f"line 1: the CSV header has an empty column name (column {position})")
        if name in seen:
            shown = f"column {name!r}" if quote else f"the name of column {seen[name]}"
            raise DatasetError("file", f"line 1: {shown} appears twice in the CSV header (again in column {position})")
        seen[name] = position


def _parquet_rows(path: Path, collector: _Collector) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow as pa  # only when a Parquet file is registered: it is a large import
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        columns = list(parquet.schema_arrow.names)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DatasetError("file", "not a readable Parquet file" + (f" ({exc})" if collector.quote else "")) from None
    collector.check_columns(columns, "the Parquet columns")
    number = 0
    try:
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for row in batch.to_pylist():
                number += 1
                yield f"row {number}", row
    except (pa.ArrowException, OSError, ValueError) as exc:
        detail = f" ({exc})" if collector.quote else ""
        raise DatasetError("file", f"row {number + 1}: the Parquet file cannot be read from here on{detail}") from None


# --- helpers ----------------------------------------------------------------------------------


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), f"a {type(value).__name__}")


def _names(columns: list[str]) -> str:
    shown = ", ".join(repr(str(c)) for c in columns[:20])
    return (shown + ", ...") if len(columns) > 20 else (shown or "no fields")


def _text(value: Any) -> str:
    """A column name or split value as text the database accepts (Postgres refuses NUL)."""
    return str(value).replace("\x00", "\ufffd")


def _preview_value(value: Any) -> Any:
    """A JSON value the database accepts: Postgres jsonb refuses NUL characters and NaN."""
    if isinstance(value, str):
        text = _text(value)
        return text if len(text) <= PREVIEW_MAX_CHARS else text[:PREVIEW_MAX_CHARS] + "…"
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {_text(k): _preview_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_preview_value(v) for v in value]
    if isinstance(value, bytes):
        return _preview_value(value.decode("utf-8", errors="replace"))
    return _preview_value(str(value))  # dates, decimals and other Parquet types
