"""Rollout files: one step's rollouts as one Parquet file (zstd), the format the engine and the SDK write
and the platform queries in place (docs/ROLLOUTS.md).

A file is named `step_<step, 8 digits>.parquet` (a second batch logged for the same step by an external
run: `step_<step>.<part>.parquet`) inside a run's rollout folder: a local folder, or any fsspec URL
(`s3://bucket/prefix/runs/<run id>/rollouts`, `memory://…` in tests). It is written whole and then put
in place (a rename on a folder, one PUT on a bucket), so a reader never sees half a file, and only then
announced: the `samples` event carries its name and the statistics below (`FileInfo.event_data`),
never the rows.

Columns (every file has all of them, in this order, so a folder of files is one table for DuckDB,
pandas or `datasets`): the rollout (`ROLLOUT_COLUMNS`) and its per-token view (`TOKEN_COLUMNS`, null
where the step did not record it). Dicts whose keys vary by run (reward components, environment logs)
are JSON text, so the schema never changes between runs and steps.

pyarrow is imported when a file is built or read: the SDK's other paths do not need it.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

FORMAT_VERSION = "1"
FOLDER = "rollouts"  # inside a run's folder
COMPRESSION = "zstd"
# Rows per row group: a page of the run page's table reads one group, not a whole step.
ROW_GROUP_ROWS = 256

# --- Bounds ------------------------------------------------------------------------------------------
# One rollout (a row) as the engine can make it, and the file around it: the engine's config takes its
# limits from here (rollout.max_new_tokens, data.max_prompt_tokens), the writer below keeps every row group
# within the group bounds, and the platform refuses an uploaded file that exceeds any of them
# (posttrain.telemetry.rollout_checks), so a reader's cost per row and per row group is known in advance.
MAX_NEW_TOKENS = 131_072  # rollout.max_new_tokens (one generation)
MAX_PROMPT_TOKENS = 131_072  # data.max_prompt_tokens: prompt_token_ids
MAX_ROLLOUT_TOKENS = 262_144  # a rollout's per-token lists (a multi-turn episode's observations included)
MAX_TEXT_BYTES = 4 << 20  # prompt, response, label, a turn's text (UTF-8 bytes)
MAX_JSON_BYTES = 64 << 10  # components, env: a JSON object's text
MAX_NAME_BYTES = 64  # finish_reason, a turn's role
MAX_ERRORS = 64  # reward errors of one rollout (one per reward component, and the weighted total's)
MAX_ERROR_BYTES = 4096  # each (the engine cuts a reason at 500 characters)
MAX_TURNS = 1024  # turns of one episode (the agent's max_turns is at most 256: its completions and observations)
MAX_PIECE_BYTES = 1024  # a token's text piece
MAX_ROW_BYTES = 16 << 20  # a row's texts and list values together
MAX_ROWS = 262_144  # rollouts in one file (one step's batch)
# Row groups: what a reader decodes at once. The writer splits a group that would hold more.
MAX_GROUP_BYTES = 32 << 20  # a row group's values (Arrow bytes, uncompressed)
MAX_GROUP_VALUES = 1 << 22  # the list values of one column in one row group
_NAME = re.compile(r"^step_(\d{8})(?:\.(\d{1,4}))?\.parquet$")

ROLLOUT_COLUMNS = (
    "step",
    "index",
    "group",
    "prompt",
    "response",
    "label",
    "reward",
    "components",  # JSON object text: {component name: score}
    "advantage",
    "length",
    "finish_reason",
    "kept",
    "errors",
    "turns",
    "env",  # JSON object text: {name: number}
    "versions",  # async mode: [[policy version, tokens]] per segment
)
# The per-token view, one value per response token (null lists where the step did not record them).
TOKEN_COLUMNS = (
    "prompt_token_ids",
    "token_ids",
    "action_mask",  # 1 = the policy's token, 0 = an environment's observation (multi-turn)
    "token_text",
    "rollout_logprob",  # the rollout engine's (the behaviour policy)
    "trainer_logprob",  # the trainer's before the update (the proximal policy); the update's old log-probs
    "ref_logprob",  # the reference model's
    "entropy",
    "token_advantage",
    "is_weight",  # the rollout correction's weight on the policy loss
    "value",  # the critic's (PPO)
    "return",  # PPO's returns
    "behaviour_logprob",  # what a loss weighing by pi_proximal / pi_behaviour itself read (decoupled PPO)
)
FLOAT_TOKEN_COLUMNS = (
    "rollout_logprob",
    "trainer_logprob",
    "ref_logprob",
    "entropy",
    "token_advantage",
    "is_weight",
    "value",
    "return",
    "behaviour_logprob",
)
# The columns a query of the run page's table reads (the per-token view is read on its own).
LIGHT_COLUMNS = ROLLOUT_COLUMNS


def schema() -> pa.Schema:
    import pyarrow as pa

    floats = pa.list_(pa.float32())
    ints = pa.list_(pa.int32())
    turn = pa.struct([("role", pa.string()), ("text", pa.string()), ("reward", pa.float64())])
    return pa.schema(
        [
            ("step", pa.int32()),
            ("index", pa.int32()),
            ("group", pa.int32()),
            ("prompt", pa.string()),
            ("response", pa.string()),
            ("label", pa.string()),
            ("reward", pa.float64()),
            ("components", pa.string()),
            ("advantage", pa.float64()),
            ("length", pa.int32()),
            ("finish_reason", pa.string()),
            ("kept", pa.bool_()),
            ("errors", pa.list_(pa.string())),
            ("turns", pa.list_(turn)),
            ("env", pa.string()),
            ("versions", pa.list_(ints)),
            ("prompt_token_ids", ints),
            ("token_ids", ints),
            ("action_mask", pa.list_(pa.int8())),
            ("token_text", pa.list_(pa.string())),
            *((name, floats) for name in FLOAT_TOKEN_COLUMNS),
        ]
    )


def file_name(step: int, part: int = 0) -> str:
    return f"step_{step:08d}.parquet" if part == 0 else f"step_{step:08d}.{part}.parquet"


def parse_file_name(name: str) -> tuple[int, int] | None:
    """(step, part) of a rollout file's name; None for anything else (a path, a temporary file)."""
    match = _NAME.match(name)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2) or 0)


def _finite(value: Any) -> float | None:
    if value is None or isinstance(value, (bool, str)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _json_text(value: Mapping[str, Any] | None) -> str:
    """A dict of numbers as JSON text; non-finite numbers as null (JSON has no NaN)."""
    return json.dumps({str(k): _finite(v) for k, v in (value or {}).items()}, sort_keys=True)


def rows_table(rows: Sequence[Mapping[str, Any]], step: int, columns: Mapping[str, Any] | None = None) -> pa.Table:
    """The table of one step from rollout records (the `samples` records of the engine and the SDK:
    prompt, response, reward, components, ...), with optional per-token `columns` (a name of
    TOKEN_COLUMNS to a list of one list per row, or to a ready pyarrow array)."""
    import pyarrow as pa

    sch = schema()
    n = len(rows)
    data: dict[str, Any] = {
        "step": [step] * n,
        "index": [int(r["index"]) for r in rows],
        "group": [int(r.get("group", 0) or 0) for r in rows],
        "prompt": [str(r["prompt"]) for r in rows],
        "response": [str(r["response"]) for r in rows],
        "label": [None if r.get("label") is None else str(r["label"]) for r in rows],
        "reward": [_finite(r.get("reward")) for r in rows],
        "components": [_json_text(r.get("components")) for r in rows],
        "advantage": [_finite(r.get("advantage")) for r in rows],
        "length": [int(r["length"]) for r in rows],
        "finish_reason": [str(r.get("finish_reason") or "stop") for r in rows],
        "kept": [bool(r.get("kept", True)) for r in rows],
        "errors": [[str(e) for e in r.get("errors") or []] for r in rows],
        "turns": [
            [
                {"role": str(t["role"]), "text": str(t["text"]), "reward": _finite(t.get("reward"))}
                for t in r.get("turns") or []
            ]
            for r in rows
        ],
        "env": [_json_text(r.get("env")) for r in rows],
        "versions": [[[int(v), int(t)] for v, t in r["versions"]] if r.get("versions") else None for r in rows],
    }
    columns = dict(columns or {})
    unknown = set(columns) - set(TOKEN_COLUMNS)
    if unknown:
        raise ValueError(f"rollout file: unknown per-token columns {sorted(unknown)}")
    arrays = []
    for field in sch:
        if field.name in data:
            arrays.append(pa.array(data[field.name], type=field.type))
        elif field.name in columns and columns[field.name] is not None:
            value = columns[field.name]
            array = value if isinstance(value, pa.Array) else pa.array(value, type=field.type)
            if len(array) != n:
                raise ValueError(f"rollout file: {field.name} has {len(array)} rows for {n} rollouts")
            arrays.append(array.cast(field.type) if array.type != field.type else array)
        else:
            arrays.append(pa.nulls(n, type=field.type))
    return pa.Table.from_arrays(arrays, schema=sch)


@dataclass(frozen=True)
class FileInfo:
    """A written rollout file: its name in the run's rollout folder, and what the platform indexes."""

    name: str
    step: int
    part: int
    rows: int
    bytes: int
    sha256: str
    stats: dict[str, Any]

    def event_data(self, **extra: Any) -> dict[str, Any]:
        """The `samples` event's data: the file's reference and statistics, never its rows."""
        return {
            "file": self.name,
            "part": self.part,
            "rows": self.rows,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "stats": self.stats,
            **extra,
        }


def table_stats(table: pa.Table) -> dict[str, Any]:
    """What the platform keeps per step (reward and length statistics, finish reasons, kept rows),
    computed from the table itself, so the event says exactly what the file holds."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def summary(column: str) -> dict[str, float | None]:
        values = table.column(column).drop_null()
        finite = pc.filter(values, pc.is_finite(values)) if pa.types.is_floating(values.type) else values
        count = len(finite)
        if not count:
            return {"count": 0, "mean": None, "min": None, "max": None}
        bounds = pc.min_max(finite).as_py()
        return {
            "count": count,
            "mean": float(pc.mean(finite).as_py()),
            "min": float(bounds["min"]),
            "max": float(bounds["max"]),
        }

    finish = pc.value_counts(table.column("finish_reason")).to_pylist() if table.num_rows else []
    tokens = table.column("token_ids")
    return {
        "reward": summary("reward"),
        "length": summary("length"),
        "finish_reasons": {row["values"]: int(row["counts"]) for row in finish},
        "kept": int(pc.sum(table.column("kept")).as_py() or 0) if table.num_rows else 0,
        "token_view": bool(table.num_rows) and tokens.null_count < table.num_rows,
    }


def encode(table: pa.Table, metadata: Mapping[str, str] | None = None) -> bytes:
    """The Parquet bytes of a table (zstd, row groups of ROW_GROUP_ROWS)."""
    import pyarrow.parquet as pq

    meta = {**(table.schema.metadata or {}), b"posttrain.format": FORMAT_VERSION.encode()}
    for key, value in (metadata or {}).items():
        meta[f"posttrain.{key}".encode()] = str(value).encode()
    table = table.replace_schema_metadata(meta)
    buffer = io.BytesIO()
    with pq.ParquetWriter(
        buffer,
        table.schema,
        compression=COMPRESSION,
        # Dictionary pages help repeated prompts and token pieces, not 4 KB responses.
        use_dictionary=["prompt", "label", "finish_reason", "token_text.list.element", "turns.list.element.role"],
        write_statistics=["step", "index", "group", "reward", "advantage", "length", "kept"],
    ) as writer:
        for start, rows in row_groups(table):
            writer.write_table(table.slice(start, rows), row_group_size=rows)
    return buffer.getvalue()


def row_groups(table: pa.Table) -> list[tuple[int, int]]:
    """(first row, rows) of each row group: ROW_GROUP_ROWS rows, or fewer where long rows would put more
    than MAX_GROUP_BYTES or, in one column, MAX_GROUP_VALUES list values in one group (halved until they
    fit; a row within the row bounds always fits alone)."""
    groups: list[tuple[int, int]] = []
    pending = [
        (start, min(ROW_GROUP_ROWS, table.num_rows - start)) for start in range(0, table.num_rows, ROW_GROUP_ROWS)
    ]
    while pending:
        start, rows = pending.pop(0)
        if rows > 1 and not _group_fits(table.slice(start, rows)):
            half = rows // 2
            pending[:0] = [(start, half), (start + half, rows - half)]
            continue
        groups.append((start, rows))
    return groups


def _group_fits(group: pa.Table) -> bool:
    if group.nbytes > MAX_GROUP_BYTES:
        return False
    return all(_leaf_values(column) <= MAX_GROUP_VALUES for column in group.columns)


def _leaf_values(column: Any) -> int:
    """How many values the innermost lists of a (chunked) list column hold; 0 for other columns."""
    import pyarrow as pa

    total = 0
    for chunk in column.chunks:
        values = chunk
        while pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
            values = values.flatten()
        total += len(values) if values is not chunk else 0
    return total


def split_url(folder: str | os.PathLike[str]) -> tuple[Any, str]:
    """(fsspec filesystem or None for a local folder, path inside it)."""
    text = os.fspath(folder)
    if "://" not in text or text.startswith("file://"):
        return None, text.removeprefix("file://")
    import fsspec

    fs, path = fsspec.core.url_to_fs(text)
    return fs, path


def put_bytes(folder: str | os.PathLike[str], name: str, data: bytes) -> None:
    """A rollout file's `data` as `<folder>/<name>`, appearing whole or not at all (`put_object`)."""
    if parse_file_name(name) is None:
        raise ValueError(f"not a rollout file name: {name!r}")
    put_object(folder, name, data)


def put_object(folder: str | os.PathLike[str], name: str, data: bytes) -> None:
    """`data` as `<folder>/<name>`, appearing whole or not at all: on a local folder a temporary file in
    the same folder renamed over the name (a killed writer leaves only a `.partial` file, which no
    query reads); on a bucket one PUT (an object appears when complete)."""
    fs, path = split_url(folder)
    if fs is None:
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        partial = directory / f".{name}.{uuid.uuid4().hex[:8]}.partial"
        try:
            with partial.open("wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, directory / name)
        finally:
            partial.unlink(missing_ok=True)
        return
    fs.makedirs(path, exist_ok=True)
    fs.pipe_file(f"{path.rstrip('/')}/{name}", data)


def write_step(
    folder: str | os.PathLike[str],
    table: pa.Table,
    *,
    step: int,
    part: int = 0,
    metadata: Mapping[str, str] | None = None,
) -> FileInfo:
    """Writes one step's table into the rollout folder; returns what its `samples` event announces."""
    data = encode(table, {"step": str(step), **(metadata or {})})
    name = file_name(step, part)
    put_bytes(folder, name, data)
    return FileInfo(
        name=name,
        step=step,
        part=part,
        rows=table.num_rows,
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        stats=table_stats(table),
    )


def remove(folder: str | os.PathLike[str], names: Iterable[str]) -> None:
    """Deletes rollout files (retention); a file already gone is fine. Other names are left alone."""
    remove_objects(folder, [name for name in names if parse_file_name(name) is not None])


def remove_objects(folder: str | os.PathLike[str], names: Iterable[str]) -> None:
    """Deletes `<folder>/<name>` for each name; one already gone is fine."""
    fs, path = split_url(folder)
    for name in names:
        if fs is None:
            Path(path, name).unlink(missing_ok=True)
        else:
            target = f"{path.rstrip('/')}/{name}"
            if fs.exists(target):
                fs.rm_file(target)


def read_table(path: str | os.PathLike[str], columns: Sequence[str] | None = None) -> pa.Table:
    """A rollout file (a local path or an fsspec URL) as a table."""
    import pyarrow.parquet as pq

    fs, inner = split_url(path)
    return pq.read_table(inner, columns=list(columns) if columns else None, filesystem=fs)
