"""The rollout store, platform side: where a run's rollout files are, and every read of them, queried in
place with DuckDB (embedded; nothing downloaded at run time). docs/ROLLOUTS.md describes the layout.

Postgres keeps one `RolloutFile` row per step file (name, rows, bytes, statistics); the rows themselves
stay in the Parquet files. Queries list a run's files from that index and read only the columns and
row groups they need; results stream (`fetchmany`), and a query ordered by step reads the files a few
at a time and stops once its page is full, so the web process never holds a whole step, let alone a
run. A file the index names but the store lacks is reported as a gap (`run_rollout_gaps`), never
skipped silently.

Text search matches a case-insensitive substring of the prompt, the response or the label (both sides
lower-cased by DuckDB), scanning the files in step order until the page is full. A text search and a
same-prompt query first consult each file's search index (`posttrain.telemetry.rollout_index`) and read only
the files that can match: a word no rollout holds reads no file at all (measured in
bench/rollout_store.py).
"""

from __future__ import annotations

import base64
import json
import math
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings

from posttrain.core.errors import NotFound
from posttrain.telemetry import rollout_index
from posttrain_sdk import rollout_files

RunId = uuid.UUID | str

# Files per DuckDB query when a query walks a run's steps in order (stops once the page is full).
FILES_PER_QUERY = 16
FETCH_ROWS = 256
# The web process's DuckDB: two threads, bounded memory (spills nothing: queries are streaming scans).
DUCKDB_THREADS = 2
DUCKDB_MEMORY_LIMIT = "512MB"
MAX_SAME_PROMPT = 2000
# The columns of the rollout table: a rollout file's, less the async segments' policy versions (the per-token
# view is read on its own, for one rollout).
TABLE_COLUMNS = tuple(c for c in rollout_files.ROLLOUT_COLUMNS if c != "versions")
_JSON_COLUMNS = ("components", "env")


def rollout_folder(run_id: RunId) -> str:
    """The run's rollout folder in the store: a local path or an fsspec URL."""
    root = str(settings.ROLLOUT_STORE).rstrip("/")
    return f"{root}/runs/{run_id}/{rollout_files.FOLDER}"


def file_location(run_id: RunId, name: str) -> str:
    if rollout_files.parse_file_name(name) is None:
        raise ValueError(f"not a rollout file name: {name!r}")
    return f"{rollout_folder(run_id)}/{name}"


def _filesystem() -> Any:
    """The store's fsspec filesystem, or None for a local folder."""
    fs, _ = rollout_files.split_url(settings.ROLLOUT_STORE)
    return fs


def _query_path(location: str) -> str:
    """What DuckDB reads: a local path as it is, a bucket object by its URL (routed to fsspec)."""
    return location.removeprefix("file://")


def existing_names(run_id: RunId) -> set[str]:
    """The rollout files the store holds for a run: one listing, not a check per file."""
    fs, folder = rollout_files.split_url(rollout_folder(run_id))
    if fs is None:
        try:
            return {p.name for p in Path(folder).iterdir() if rollout_files.parse_file_name(p.name)}
        except FileNotFoundError:
            return set()
    try:
        listed = fs.ls(folder, detail=False)
    except FileNotFoundError:
        return set()
    return {name for name in (str(p).rsplit("/", 1)[-1] for p in listed) if rollout_files.parse_file_name(name)}


def store_upload(run_id: RunId, name: str, chunks: Iterator[bytes]) -> int:
    """An external run's uploaded file, streamed into the store as it arrives (never parsed here); it
    appears whole or not at all, as the engine's files do."""
    location = file_location(run_id, name)
    fs, path = rollout_files.split_url(location)
    if fs is not None:  # a bucket: one PUT of the whole object
        data = b"".join(chunks)
        rollout_files.put_bytes(rollout_folder(run_id), name, data)
        return len(data)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{name}.{uuid.uuid4().hex[:8]}.partial")
    size = 0
    try:
        with partial.open("wb") as f:
            for chunk in chunks:
                f.write(chunk)
                size += len(chunk)
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return size


def open_file(run_id: RunId, name: str) -> Any:
    """A rollout file opened for reading (the export streams it)."""
    fs, path = rollout_files.split_url(file_location(run_id, name))
    try:
        return open(path, "rb") if fs is None else fs.open(path, "rb")
    except FileNotFoundError:
        raise NotFound(f"the rollout file {name} of run {run_id} is not in the store") from None


# --- DuckDB -------------------------------------------------------------------------------------

_local = threading.local()


def connection() -> Any:
    """This thread's DuckDB connection (DuckDB connections are not shared between threads)."""
    con = getattr(_local, "con", None)
    if con is None:
        import duckdb

        con = duckdb.connect(
            config={
                "threads": DUCKDB_THREADS,
                "memory_limit": DUCKDB_MEMORY_LIMIT,
                # Nothing is downloaded at run time: an extension DuckDB lacks is an error, not a fetch.
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
            }
        )
        fs = _filesystem()
        if fs is not None:
            con.register_filesystem(fs)
        _local.con = con
    return con


def reset_connections() -> None:
    """Forget this thread's connection (tests that switch stores)."""
    con = getattr(_local, "con", None)
    if con is not None:
        con.close()
        _local.con = None


# --- queries ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredFile:
    run_id: str
    step: int
    part: int
    name: str
    rows: int
    sha256: str = ""
    bytes: int = 0

    @property
    def location(self) -> str:
        return _query_path(file_location(self.run_id, self.name))


def run_files(run_ids: Sequence[RunId], steps: Sequence[int] | None = None) -> list[StoredFile]:
    """The indexed rollout files of the runs (in the order given), by step and part."""
    from posttrain.telemetry.models import RolloutFile

    files = RolloutFile.objects.filter(run_id__in=list(run_ids))
    if steps is not None:
        files = files.filter(step__in=list(steps))
    by_run: dict[str, list[StoredFile]] = {}
    for run_id, step, part, name, rows, sha256, size in files.order_by("step", "part").values_list(
        "run_id", "step", "part", "name", "rows", "sha256", "bytes"
    ):
        by_run.setdefault(str(run_id), []).append(StoredFile(str(run_id), step, part, name, rows, sha256, size))
    return [f for run_id in dict.fromkeys(str(r) for r in run_ids) for f in by_run.get(run_id, [])]


@dataclass
class RolloutFilter:
    """Conditions on a run's rollouts; every one optional."""

    steps: Sequence[int] | None = None
    step_range: tuple[int, int] | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    min_advantage: float | None = None
    max_advantage: float | None = None
    min_length: int | None = None  # response tokens
    max_length: int | None = None
    finish_reason: str | None = None
    q: str | None = None  # a case-insensitive substring of the prompt, the response or the label
    prompt: str | None = None  # the exact prompt
    group: int | None = None
    kept: bool | None = None
    index: int | None = None

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if self.step_range is not None:
            clauses.append("step BETWEEN ? AND ?")
            params += list(self.step_range)
        for column, low, high in (
            ("reward", self.min_reward, self.max_reward),
            ("advantage", self.min_advantage, self.max_advantage),
            ("length", self.min_length, self.max_length),
        ):
            if low is not None:
                clauses.append(f"{_quoted(column)} >= ?")
                params.append(low)
            if high is not None:
                clauses.append(f"{_quoted(column)} <= ?")
                params.append(high)
        if self.finish_reason:
            clauses.append("finish_reason = ?")
            params.append(self.finish_reason)
        if self.prompt is not None:
            clauses.append("prompt = ?")
            params.append(self.prompt)
        if self.group is not None:
            clauses.append('"group" = ?')
            params.append(self.group)
        if self.kept is not None:
            clauses.append("kept = ?")
            params.append(self.kept)
        if self.index is not None:
            clauses.append('"index" = ?')
            params.append(self.index)
        if self.q:
            # The search index (rollout_index) lower-cases with the same DuckDB `lower`.
            clauses.append(
                "(contains(lower(response), lower(?)) OR contains(lower(prompt), lower(?))"
                " OR contains(lower(coalesce(label, '')), lower(?)))"
            )
            params += [self.q] * 3
        return (" AND ".join(clauses) or "TRUE"), params

    @property
    def only_steps(self) -> bool:
        """Nothing but steps: a count comes from the index, without reading a file."""
        return not any(
            v is not None and v != ""
            for v in (
                self.step_range,
                self.min_reward,
                self.max_reward,
                self.min_advantage,
                self.max_advantage,
                self.min_length,
                self.max_length,
                self.finish_reason,
                self.q,
                self.prompt,
                self.group,
                self.kept,
                self.index,
            )
        )


def _quoted(column: str) -> str:
    return f'"{column}"'


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    for name in _JSON_COLUMNS:
        if name in row and isinstance(row[name], str):
            row[name] = json.loads(row[name])
    for name in ("reward", "advantage"):
        value = row.get(name)
        if isinstance(value, float) and not math.isfinite(value):
            row[name] = None
    return row


def _stream(sql: str, params: list[Any]) -> Iterator[dict[str, Any]]:
    cursor = connection().cursor()
    try:
        cursor.execute(sql, params)
        names = [d[0] for d in cursor.description]
        while rows := cursor.fetchmany(FETCH_ROWS):
            for values in rows:
                yield dict(zip(names, values, strict=True))
    finally:
        cursor.close()


def rollouts_query(
    run_ids: Sequence[RunId],
    *,
    filters: RolloutFilter | None = None,
    columns: Sequence[str] = TABLE_COLUMNS,
    limit: int | None = None,
    offset: int = 0,
    present: set[tuple[str, str]] | None = None,
    files: list[StoredFile] | None = None,
) -> Iterator[dict[str, Any]]:
    """The rollouts of `run_ids` matching `filters` as plain dicts (`run` plus `columns`), ordered by run
    (as given), step and index, `offset` rows skipped and at most `limit` returned. Streams: the files
    are read a few at a time, in step order, until `limit` rows are out. Files the index names but the
    store lacks are left out (`present`: the (run, name) pairs known to exist; default: listed here);
    `run_rollout_gaps` names them.

    The one reader of rollouts for every page and API: the run page's table, compare, review campaigns'
    sampling (a `Candidate` per dict), the samples API and the SDK."""
    filters = filters or RolloutFilter()
    if files is None:  # `files`: the index already read (the bench reads files it wrote itself)
        files = run_files(run_ids, filters.steps)
        if present is None:
            present = {(str(r), n) for r in dict.fromkeys(str(r) for r in run_ids) for n in existing_names(r)}
        files = [f for f in files if (f.run_id, f.name) in present]
    where, params = filters.where()
    select = ", ".join(_quoted(c) for c in columns)
    skip, left = offset, limit
    # A text search or a prompt: only the files their search index cannot rule out, consulted as we go.
    for chunk in rollout_index.candidate_chunks(connection(), files, filters.q, filters.prompt, FILES_PER_QUERY):
        if left is not None and left <= 0:
            return
        run_of = {f.location: f.run_id for f in chunk}
        window = ""
        if left is not None:
            window = f" LIMIT {int(left) + int(skip)}"
        sql = (
            f"SELECT filename, {select} FROM read_parquet(?, filename = true) WHERE {where} "
            f'ORDER BY list_position(?, filename), step, "index"{window}'
        )
        locations = [f.location for f in chunk]
        for row in _stream(sql, [locations, *params, locations]):
            if skip > 0:
                skip -= 1
                continue
            row["run"] = run_of.get(row.pop("filename"), "")
            yield _decode(row)
            if left is not None:
                left -= 1
                if left <= 0:
                    return


def rollouts_count(
    run_ids: Sequence[RunId], filters: RolloutFilter | None = None, present: set[tuple[str, str]] | None = None
) -> int | None:
    """How many rollouts match: from the index alone with no filter but steps, from a scan of the
    filtered columns otherwise; None for a text search (it would read every response: the page pages
    with `next` instead)."""
    filters = filters or RolloutFilter()
    files = run_files(run_ids, filters.steps)
    if present is not None:
        files = [f for f in files if (f.run_id, f.name) in present]
    if filters.only_steps:
        return sum(f.rows for f in files)
    if filters.q:
        return None
    if filters.prompt is not None:
        files = rollout_index.candidate_files(connection(), files, None, filters.prompt)
    if not files:
        return 0
    where, params = filters.where()
    rows = list(
        _stream(f"SELECT count(*) AS n FROM read_parquet(?) WHERE {where}", [[f.location for f in files], *params])
    )
    return int(rows[0]["n"])


# --- one rollout --------------------------------------------------------------------------------


def pack_f16(values: Sequence[float] | None) -> str | None:
    """Per-token values as base64 little-endian float16 (the dialog's wire format)."""
    if values is None:
        return None
    array = np.asarray([math.nan if v is None else v for v in values], dtype="<f2")
    return base64.b64encode(array.tobytes()).decode("ascii")


# The dialog's arrays, by its name: the file's column.
VIEW_COLUMNS = {
    "rollout_logprob": "rollout_logprob",
    "trainer_logprob": "trainer_logprob",
    "entropy": "entropy",
    "advantage": "token_advantage",
}
MAX_VIEW_TOKENS = 8192


def packed_view(row: dict[str, Any]) -> dict[str, Any]:
    """A rollout's per-token view as the dialog reads it: {text: [piece], <array>: base64 float16 (one
    value per piece), versions}; {} when its step recorded none."""
    text = row.get("token_text") or []
    if not text:
        return {}
    view: dict[str, Any] = {"text": text[:MAX_VIEW_TOKENS]}
    for name, column in VIEW_COLUMNS.items():
        values = row.get(column)
        if values is not None:
            view[name] = pack_f16(values[:MAX_VIEW_TOKENS])
    if row.get("versions"):
        view["versions"] = [list(v) for v in row["versions"]]
    return view


def rollout_token_view(run_id: RunId, step: int, index: int) -> dict[str, Any]:
    """One rollout's per-token view ({text, <array>: base64 float16, versions}) and the responses to the
    same prompt at every step ([{step, index}], at most MAX_SAME_PROMPT). NotFound names the rollout."""
    present = existing_names(run_id)
    rows = list(
        rollouts_query(
            [run_id],
            filters=RolloutFilter(steps=[step], index=index),
            columns=["prompt", "versions", "token_text", *VIEW_COLUMNS.values()],
            limit=1,
            present={(str(run_id), n) for n in present},
        )
    )
    if not rows:
        raise NotFound(f"run {run_id} has no rollout {index} at step {step}")
    found = rows[0]
    same = rollouts_query(
        [run_id],
        filters=RolloutFilter(prompt=found["prompt"]),
        columns=("step", "index"),
        limit=MAX_SAME_PROMPT,
        present={(str(run_id), n) for n in present},
    )
    return {
        "step": step,
        "index": index,
        "tokens": packed_view(found),
        "same_prompt": [{"step": r["step"], "index": r["index"]} for r in same],
    }


# --- gaps ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gap:
    step: int
    reason: str


@dataclass
class RolloutFiles:
    """A run's rollout files as the page lists them."""

    files: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)


def run_rollout_files(run: Any) -> RolloutFiles:
    """The run's indexed files (with whether the store still holds each), and its gaps: a file the index
    names that the store lacks, and a step the engine trained without announcing its file (every
    earlier step than the latest announced one, for a native run that records every step's rollouts)."""
    from posttrain.telemetry.models import RolloutFile

    present = existing_names(run.pk)
    out = RolloutFiles()
    indexed_steps: set[int] = set()
    rows = RolloutFile.objects.filter(run=run).order_by("step", "part")
    for values in rows.values("step", "part", "name", "rows", "bytes", "sha256", "stats"):
        item: dict[str, Any] = {**values, "available": values["name"] in present}
        out.files.append(item)
        indexed_steps.add(item["step"])
        if not item["available"]:
            out.gaps.append(Gap(item["step"], "its rollout file never arrived in the store (or was removed)"))
    config: dict[str, Any] = run.resolved_config if isinstance(run.resolved_config, dict) else {}
    logging_cfg: dict[str, Any] = config["logging"] if isinstance(config.get("logging"), dict) else {}
    if not run.is_external and logging_cfg.get("samples", "all") == "all" and indexed_steps:
        keep = str(logging_cfg.get("rollouts_keep") or "all")
        expected = _expected_steps(keep, 1, max(indexed_steps))
        for step in sorted(expected - indexed_steps):
            out.gaps.append(Gap(step, "the engine trained this step but its rollout file was never announced"))
    out.gaps.sort(key=lambda gap: gap.step)
    return out


def _expected_steps(keep: str, first: int, last: int) -> set[int]:
    mode, _, n = keep.partition(" ")
    if mode == "every" and n.isdigit():
        return {s for s in range(first, last + 1) if s % int(n) == 0}
    if mode == "last" and n.isdigit():
        return set(range(max(first, last - int(n) + 1), last + 1))
    return set(range(first, last + 1))


# --- the search index (posttrain.telemetry.rollout_index) -----------------------------------------------


def rollout_index_update(run_id: RunId) -> int:
    """Builds the search index of every indexed rollout file of the run that the store holds and that
    has no current one; returns how many it wrote. Idempotent (two at once write the same bytes). A
    worker's task, after each samples event; never the web process's."""
    present = existing_names(run_id)
    files = [f for f in run_files([run_id]) if f.name in present]
    sidecars = rollout_index.read_sidecars(files)
    written = 0
    for f, sidecar in zip(files, sidecars):
        if sidecar is not None and sidecar.fits(f):
            continue
        try:
            rollout_index_build(run_id, f.name)
        except FileNotFoundError:
            continue  # removed since the listing (retention): nothing to index
        written += 1
    return written


def rollout_index_build(run_id: RunId, name: str) -> None:
    """Writes the search index of one rollout file of the run (FileNotFoundError when the store lacks it)."""
    location = file_location(run_id, name)
    sha256, size = rollout_index.file_digest(location)
    text = rollout_index.index_text(connection(), _query_path(location), sha256, size)
    rollout_index.write_sidecar(run_id, name, text)
