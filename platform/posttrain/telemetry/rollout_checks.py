"""Checks of a rollout file against the format the engine and the SDK write (posttrain_sdk.rollout_files:
its schema and its bounds), none of which reads the file into Python (docs/ROLLOUTS.md, "Upload checks"):

- `check_upload`: an external run's uploaded file, before it is put in place. Its footer is read with
  pyarrow (its length bounded first, from the file's last eight bytes); its schema must be the rollout
  file's; its row count, its row groups' sizes and each column chunk's value count come from the footer's
  metadata; then one DuckDB pass (its own connection: one thread, bounded memory) measures every row's
  texts, lists and bytes against the row bounds and names the first row at fault.
- `unreadable_reason`: why a stored file a query could not read is unreadable (a reader's gap), from the
  same footer and schema checks and a read of the columns the query needs.

A refusal names the column and the row (`row 17 (index 3)`: the row in the file, the rollout's index)
and never quotes a server path: DuckDB's own messages, which do, are not passed on.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.core.errors import InvalidInput
from posttrain_sdk import rollout_files as rf

MAX_FOOTER_BYTES = 8 << 20  # a file of MAX_ROWS rows in groups of 256 has a footer of a few MB
# Parquet's uncompressed sizes are not Arrow's (levels, length prefixes): the writer's bounds, with room.
MAX_GROUP_PARQUET_BYTES = 2 * rf.MAX_GROUP_BYTES
CHECK_MEMORY_LIMIT = "512MB"
_TRAILER = 8  # a Parquet file ends with its footer's length (4 bytes, little-endian) and PAR1


class RolloutFileRefused(InvalidInput):
    """An uploaded body that is not a rollout file within the bounds (400, loc `body`)."""

    def __init__(self, message: str):
        super().__init__([{"loc": "body", "msg": message}])


# --- the schema -----------------------------------------------------------------------------------


def _normal(data_type: Any) -> str:
    """A type as the check compares it: large and plain strings and lists alike, field names and
    nullability ignored (other writers than pyarrow name a list's element differently)."""
    import pyarrow as pa

    if pa.types.is_large_string(data_type) or pa.types.is_string(data_type):
        return "string"
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return f"list<{_normal(data_type.value_type)}>"
    if pa.types.is_struct(data_type):
        fields = ", ".join(
            f"{data_type.field(i).name}: {_normal(data_type.field(i).type)}" for i in range(data_type.num_fields)
        )
        return f"struct<{fields}>"
    return str(data_type)


def schema_problem(actual: Any, columns: Sequence[str] | None = None) -> str | None:
    """What is wrong with a file's Arrow schema against the rollout file's (only `columns`, when given):
    the first missing or mistyped column, or None."""
    expected = rf.schema()
    wanted = list(columns) if columns is not None else list(expected.names)
    names = set(actual.names)
    for name in wanted:
        if name not in names:
            return f"it has no column {name!r} (a rollout file has {', '.join(expected.names)})"
        found, needed = _normal(actual.field(name).type), _normal(expected.field(name).type)
        if found != needed:
            return f"its column {name!r} is {found}, not {needed}"
    if columns is None:
        extra = [name for name in actual.names if name not in set(expected.names)]
        if extra:
            return f"it has a column {extra[0]!r} that a rollout file does not have"
    return None


# --- the footer ------------------------------------------------------------------------------------


def _footer_length(f: Any, size: int) -> int:
    f.seek(size - _TRAILER)
    trailer = f.read(_TRAILER)
    if len(trailer) != _TRAILER or trailer[4:] != b"PAR1":
        raise RolloutFileRefused("not a Parquet file: it does not end as one")
    (length,) = struct.unpack("<I", trailer[:4])
    return int(length)


def _open_footer(f: Any, size: int) -> Any:
    """The file's pyarrow metadata (its footer), read once its length is known to be within bounds."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    length = _footer_length(f, size)
    if length > MAX_FOOTER_BYTES or length + _TRAILER + 4 > size:
        raise RolloutFileRefused(
            f"not a rollout file: its Parquet footer says it is {length} bytes long (at most {MAX_FOOTER_BYTES}, "
            f"within the file's {size})"
        )
    f.seek(0)
    try:
        return pq.ParquetFile(
            f, thrift_string_size_limit=MAX_FOOTER_BYTES, thrift_container_size_limit=MAX_FOOTER_BYTES
        )
    except (pa.ArrowException, OSError, ValueError):
        raise RolloutFileRefused("not a Parquet file: its footer cannot be read") from None


def _check_layout(parquet: Any) -> None:
    """The footer's numbers against the bounds: rows, each row group's bytes, each column chunk's values."""
    meta = parquet.metadata
    if meta.num_rows > rf.MAX_ROWS:
        raise RolloutFileRefused(f"it has {meta.num_rows} rows; a rollout file has at most {rf.MAX_ROWS}")
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if group.total_byte_size > MAX_GROUP_PARQUET_BYTES:
            raise RolloutFileRefused(
                f"its row group {g} holds {group.total_byte_size} bytes uncompressed; at most "
                f"{MAX_GROUP_PARQUET_BYTES} (write it with posttrain_sdk.rollout_files.encode)"
            )
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.num_values > rf.MAX_GROUP_VALUES + group.num_rows:
                raise RolloutFileRefused(
                    f"column {chunk.path_in_schema.split('.')[0]!r} holds {chunk.num_values} values in row group "
                    f"{g} ({group.num_rows} rows); at most {rf.MAX_GROUP_VALUES} list values per row group"
                )


# Per row, the most values a list column may hold: what a reader checks in a stored file's footer before it
# reads the column (`list_values_problems`), since the rows of a row group together hold at most rows x this.
LIST_VALUES_PER_ROW: dict[str, int] = {
    "errors": rf.MAX_ERRORS,
    "turns": rf.MAX_TURNS,
    "versions": 2 * rf.MAX_ROLLOUT_TOKENS,
    "prompt_token_ids": rf.MAX_PROMPT_TOKENS,
    **{c: rf.MAX_ROLLOUT_TOKENS for c in rf.TOKEN_COLUMNS if c != "prompt_token_ids"},
}


def list_values_problems(location: str) -> dict[str, str]:
    """The list columns whose values a stored file's footer shows more of, in a row group, than its rows
    could hold within the bounds (an old upload, made before the checks), each with what is wrong: a
    reader leaves such a file out rather than have DuckDB decode the column. {} when none is (or when the
    footer cannot tell: the query finds out)."""
    fs, path = rf.split_url(location)
    try:
        with open(path, "rb") if fs is None else fs.open(path, "rb") as f:
            meta = _open_footer(f, f.seek(0, 2)).metadata
    except (OSError, RolloutFileRefused):
        return {}
    problems: dict[str, str] = {}
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            column = chunk.path_in_schema.split(".")[0]
            most = LIST_VALUES_PER_ROW.get(column)
            if most is not None and column not in problems and chunk.num_values > group.num_rows * (most + 1):
                problems[column] = (
                    f"its column {column!r} holds {chunk.num_values} values in {group.num_rows} rows "
                    f"(row group {g}); a rollout holds at most {most}"
                )
    return problems


# --- the rows --------------------------------------------------------------------------------------


def _quote(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'


@dataclass(frozen=True)
class RowBound:
    """A measure of each row (SQL over the file's columns) and the most it may be."""

    what: str  # the column (and part) a refusal names
    sql: str
    limit: int
    unit: str


def _longest_item(column: str, measure: str = "strlen(x)") -> str:
    return f"list_max(list_transform({_quote(column)}, x -> {measure}))"


def _sum_items(column: str, measure: str) -> str:
    return f"coalesce(list_sum(list_transform({_quote(column)}, x -> {measure})), 0)"


def _length(column: str) -> str:
    return f"coalesce(len({_quote(column)}), 0)"


# A row's bytes: its texts, and its lists' values at their width (strings at their length).
_ROW_BYTES = " + ".join(
    [
        *(f"coalesce(strlen({c}), 0)" for c in ("prompt", "response", "label", "components", "env", "finish_reason")),
        _sum_items("errors", "strlen(x)"),
        _sum_items("turns", "coalesce(strlen(x.text), 0) + coalesce(strlen(x.role), 0) + 8"),
        _sum_items("token_text", "strlen(x) + 4"),
        f"8 * {_length('versions')}",
        f"4 * {_length('prompt_token_ids')}",
        f"4 * {_length('token_ids')}",
        _length("action_mask"),
        *(f"4 * {_length(c)}" for c in rf.FLOAT_TOKEN_COLUMNS),
    ]
)

ROW_BOUNDS: tuple[RowBound, ...] = (
    *(RowBound(c, f"strlen({c})", rf.MAX_TEXT_BYTES, "bytes") for c in ("prompt", "response", "label")),
    *(RowBound(c, f"strlen({c})", rf.MAX_JSON_BYTES, "bytes") for c in ("components", "env")),
    RowBound("finish_reason", "strlen(finish_reason)", rf.MAX_NAME_BYTES, "bytes"),
    RowBound("errors", "len(errors)", rf.MAX_ERRORS, "errors"),
    RowBound("errors (one error)", _longest_item("errors"), rf.MAX_ERROR_BYTES, "bytes"),
    RowBound("turns", "len(turns)", rf.MAX_TURNS, "turns"),
    RowBound("turns (a turn's text)", _longest_item("turns", "strlen(x.text)"), rf.MAX_TEXT_BYTES, "bytes"),
    RowBound("turns (a turn's role)", _longest_item("turns", "strlen(x.role)"), rf.MAX_NAME_BYTES, "bytes"),
    RowBound("versions", "len(versions)", rf.MAX_ROLLOUT_TOKENS, "segments"),
    RowBound("versions (a segment)", _longest_item("versions", "len(x)"), 2, "values"),
    RowBound("prompt_token_ids", "len(prompt_token_ids)", rf.MAX_PROMPT_TOKENS, "tokens"),
    *(
        RowBound(c, f"len({_quote(c)})", rf.MAX_ROLLOUT_TOKENS, "values")
        for c in rf.TOKEN_COLUMNS
        if c != "prompt_token_ids"
    ),
    RowBound("token_text (a piece)", _longest_item("token_text"), rf.MAX_PIECE_BYTES, "bytes"),
    RowBound("the row", _ROW_BYTES, rf.MAX_ROW_BYTES, "bytes"),
)
# Not measures but facts every row must have: its step is the file name's, its JSON texts are objects.
_JSON_OBJECT = "CASE WHEN {c} IS NULL OR (json_valid({c}) AND json_type({c}) = 'OBJECT') THEN 0 ELSE 1 END"


def _check_connection() -> Any:
    import duckdb

    return duckdb.connect(
        config={
            "threads": 1,
            "memory_limit": CHECK_MEMORY_LIMIT,
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
        }
    )


def _row_checks(step: int) -> list[tuple[str, str, int, str]]:
    """(what, SQL measure, limit, message) of every row check; the message takes {value} and {limit}."""
    checks = [(b.what, b.sql, b.limit, f"{b.what} is {{value}} {b.unit}; at most {{limit}}") for b in ROW_BOUNDS]
    checks += [(c, _JSON_OBJECT.format(c=c), 0, f"{c} is not the text of a JSON object") for c in ("components", "env")]
    checks.append(
        (
            "step",
            f"CASE WHEN step IS DISTINCT FROM {int(step)} THEN 1 ELSE 0 END",
            0,
            f"step is not {step}, the file name's",
        )
    )
    return checks


def _check_rows(path: str, step: int) -> None:
    """One DuckDB pass over the staged file: each check's largest value and the first row that has it."""
    import duckdb

    checks = _row_checks(step)
    measures = ", ".join(
        f'max({sql}) AS m{i}, arg_max(file_row_number, {sql}) AS r{i}, arg_max("index", {sql}) AS x{i}'
        for i, (_, sql, _, _) in enumerate(checks)
    )
    con = _check_connection()
    try:
        found = con.execute(f"SELECT {measures} FROM read_parquet(?, file_row_number = true)", [path]).fetchone()
    except duckdb.Error as exc:
        raise RolloutFileRefused(
            f"not a readable rollout file: its rows cannot be decoded ({type(exc).__name__})"
        ) from None
    finally:
        con.close()
    assert found is not None  # an aggregate has one row
    for i, (_, _, limit, message) in enumerate(checks):
        value, row, index = found[3 * i], found[3 * i + 1], found[3 * i + 2]
        if value is not None and value > limit:
            raise RolloutFileRefused(f"row {row} (index {index}): {message.format(value=value, limit=limit)}")


# --- entry points ------------------------------------------------------------------------------------


def check_upload(path: str, name: str) -> None:
    """A staged upload (a local file) against the rollout file's schema and bounds; RolloutFileRefused
    naming what is wrong (the column, the row group or the row)."""

    parsed = rf.parse_file_name(name)
    if parsed is None:
        raise ValueError(f"not a rollout file name: {name!r}")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        parquet = _open_footer(f, size)
        problem = schema_problem(parquet.schema_arrow)
        if problem is not None:
            raise RolloutFileRefused(f"not a rollout file: {problem}")
        _check_layout(parquet)
    _check_rows(path, parsed[0])


def unreadable_reason(location: str, columns: Sequence[str], con: Any) -> str | None:
    """Why a stored rollout file a query failed on cannot be read (for its gap): missing, not Parquet,
    not the rollout file's columns, or data DuckDB cannot decode; None when `columns` read well (the
    query, not the file, is at fault). `con`: the reader's connection (it knows the store's filesystem)."""
    import duckdb

    problem = _footer_problem(location, columns)
    if problem is not None:
        return problem
    select = ", ".join(_quote(c) for c in columns) or _quote("step")
    try:
        con.execute(
            f"SELECT count(*) FROM read_parquet(?) WHERE hash({select}) IS NOT NULL", [location.removeprefix("file://")]
        ).fetchall()
    except duckdb.Error as exc:
        return f"its data cannot be decoded ({type(exc).__name__})"
    return None


def _footer_problem(location: str, columns: Sequence[str]) -> str | None:
    """What the file's footer says is wrong for a query of `columns` (None: nothing)."""
    fs, path = rf.split_url(location)
    try:
        with open(path, "rb") if fs is None else fs.open(path, "rb") as f:
            size = f.seek(0, 2)
            return schema_problem(_open_footer(f, size).schema_arrow, columns)
    except FileNotFoundError:
        return "it is not in the store (never arrived, or removed)"
    except RolloutFileRefused as refused:
        return refused.errors[0]["msg"]
    except OSError as exc:
        return f"it cannot be opened ({type(exc).__name__})"
