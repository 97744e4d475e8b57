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
import os
import tempfile
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction

from posttrain.core.errors import Conflict, IllegalTransition, NotFound
from posttrain.telemetry import rollout_checks, rollout_index
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
_KEY_STEP = 1 << 32  # (step, index) as one number: step * _KEY_STEP + index


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


def rollout_upload(run_id: RunId, name: str, chunks: Iterator[bytes]) -> int:
    """An external run's uploaded rollout file, put in place once it is known to be one: refused (409) to
    a run that ended and for a name a `samples` event announced already (an announced file is never
    replaced: the index keeps its digest); streamed to a staged file as it arrives, checked there against
    the rollout file's schema and bounds (posttrain.telemetry.rollout_checks: 400 naming the column and
    row), and put in place under the run's row lock (which ingestion holds while it indexes a file), after
    both refusals are checked again. The staged file is removed whatever happens. Returns its bytes."""
    _accepts_upload(run_id, name)
    with _staged(run_id, name) as staged:
        size = _write_chunks(staged, chunks)
        rollout_checks.check_upload(str(staged), name)
        with transaction.atomic():
            _accepts_upload(run_id, name, lock=True)
            _put_staged(run_id, name, staged)
    return size


def _accepts_upload(run_id: RunId, name: str, *, lock: bool = False) -> None:
    from posttrain.runs.models import TERMINAL_STATES, Run, RunState
    from posttrain.runs.services.state_machine import run_revive_lost

    runs = Run.objects.select_for_update() if lock else Run.objects
    state = runs.filter(pk=run_id).values_list("state", flat=True).first()
    if state == RunState.FAILED and run_revive_lost(run_id):  # a lost run's client uploads: it is back
        state = RunState.RUNNING
    if state in TERMINAL_STATES:
        raise IllegalTransition(f"run {run_id} has ended ({state}): it takes no more rollout files", state)
    if announced(run_id, name):
        raise Conflict(
            f"{name} is announced already (a samples event named it): an announced rollout file is never replaced",
            loc="name",
        )


def announced(run_id: RunId, name: str) -> bool:
    """Whether a `samples` event named this file (it is in the run's index)."""
    from posttrain.telemetry.models import RolloutFile

    return RolloutFile.objects.filter(run_id=run_id, name=name).exists()


@contextmanager
def _staged(run_id: RunId, name: str) -> Iterator[Path]:
    """Where an upload is staged, removed on the way out: a hidden partial file beside its place on a
    folder (put in place by a rename), a temporary local file for a bucket (put by one PUT)."""
    location = file_location(run_id, name)
    fs, path = rollout_files.split_url(location)
    if fs is None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(f".{name}.{uuid.uuid4().hex[:8]}.partial")
    else:
        handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial")
        os.close(handle)
        staged = Path(temporary)
    try:
        yield staged
    finally:
        staged.unlink(missing_ok=True)


def _write_chunks(staged: Path, chunks: Iterator[bytes]) -> int:
    size = 0
    with staged.open("wb") as f:
        for chunk in chunks:
            f.write(chunk)
            size += len(chunk)
    return size


def _put_staged(run_id: RunId, name: str, staged: Path) -> None:
    fs, path = rollout_files.split_url(file_location(run_id, name))
    if fs is None:
        staged.replace(path)
    else:
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(str(staged), path)


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


def present_files(
    run_id: RunId,
    steps: Sequence[int] | None = None,
    step_range: tuple[int, int] | None = None,
    gaps: list[Gap] | None = None,
) -> list[StoredFile]:
    """The run's indexed files at `steps` (or within `step_range`) that the store holds, by step and part;
    each one it lacks is added to `gaps`."""
    files = run_files([run_id], steps)
    if step_range is not None:
        files = [f for f in files if step_range[0] <= f.step <= step_range[1]]
    present = existing_names(run_id)
    if gaps is not None:
        gaps += [
            Gap(f.step, f"its rollout file {f.name} is not in the store (never arrived, or removed)", f.name, f.run_id)
            for f in files
            if f.name not in present
        ]
    return [f for f in files if f.name in present]


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
    keys: Sequence[tuple[int, int]] | None = None  # exactly these (step, index)

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
        if self.keys is not None:
            clauses.append(f'list_contains(?, step::BIGINT * {_KEY_STEP} + "index")')
            params.append(sorted({int(step) * _KEY_STEP + int(index) for step, index in self.keys}))
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
                self.keys,
            )
        )


def _quoted(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'


# --- what an answer shows of a row ---------------------------------------------------------------------
# Every text and list is cut in the query (DuckDB's substring and list_slice), so a row costs the web
# process at most these, whatever the file holds; a row says what was cut in `truncated`: {what: its full
# length}, characters for a text, items for a list ("<column>.text": the longest item's characters where
# items were cut). A JSON text longer than JSON_CHARS is shown as {} (half an object is no object).
TEXT_CHARS = 16_384  # prompt, response
LABEL_CHARS = 4096
NAME_CHARS = 64  # finish_reason, a turn's role
JSON_CHARS = 16_384  # components, env
ERRORS_SHOWN = 16
ERROR_CHARS = 1000
TURNS_SHOWN = 32
TURN_CHARS = 4096
MAX_VIEW_TOKENS = 8192  # per-token lists and async segments
PIECE_CHARS = 64  # a token's text piece


@dataclass(frozen=True)
class Shown:
    """How a column is read: `select` (SQL, `$c` the column) and the measures that tell whether it was
    cut: (a suffix to the column's name in `truncated`, SQL of its full size, the size shown)."""

    select: str
    sizes: tuple[tuple[str, str, int], ...] = ()


def _text(chars: int) -> Shown:
    return Shown(f"substring($c, 1, {chars})", (("", "length($c)", chars),))


def _json(chars: int) -> Shown:
    return Shown(f"CASE WHEN length($c) <= {chars} THEN $c ELSE '{{}}' END", (("", "length($c)", chars),))


def _list(items: int, item: str = "", item_chars: int = 0, item_length: str = "length(x)") -> Shown:
    """The first `items` of a list; each item cut by `item` (SQL over x) when given."""
    sliced = f"list_slice($c, 1, {items})"
    if not item:
        return Shown(sliced, (("", "len($c)", items),))
    longest = f"list_max(list_transform($c, x -> {item_length}))"
    return Shown(f"list_transform({sliced}, x -> {item})", (("", "len($c)", items), (".text", longest, item_chars)))


_TURN = (
    f"{{'role': substring(x.role, 1, {NAME_CHARS}), 'text': substring(x.text, 1, {TURN_CHARS}), 'reward': x.reward}}"
)
SHOWN: dict[str, Shown] = {
    "prompt": _text(TEXT_CHARS),
    "response": _text(TEXT_CHARS),
    "label": _text(LABEL_CHARS),
    "finish_reason": _text(NAME_CHARS),
    "components": _json(JSON_CHARS),
    "env": _json(JSON_CHARS),
    "errors": _list(ERRORS_SHOWN, f"substring(x, 1, {ERROR_CHARS})", ERROR_CHARS),
    "turns": _list(TURNS_SHOWN, _TURN, TURN_CHARS, "length(x.text)"),
    "versions": _list(MAX_VIEW_TOKENS, "list_slice(x, 1, 2)", 2, "len(x)"),
    "token_text": _list(MAX_VIEW_TOKENS, f"substring(x, 1, {PIECE_CHARS})", PIECE_CHARS),
    **{c: _list(MAX_VIEW_TOKENS) for c in rollout_files.TOKEN_COLUMNS if c != "token_text"},
}


def _select(columns: Sequence[str], whole: Sequence[str] = ()) -> tuple[str, list[tuple[str, int]]]:
    """The SELECT list of `columns` as answers show them (a column in `whole` read as stored), and the
    size measures it adds: (`truncated`'s name, the size shown), in the order of their `__size_<i>` columns."""
    items: list[str] = []
    sizes: list[tuple[str, int]] = []
    for column in columns:
        quoted = _quoted(column)
        shown = None if column in whole else SHOWN.get(column)
        if shown is None:
            items.append(quoted)
            continue
        items.append(f"{shown.select.replace('$c', quoted)} AS {quoted}")
        for suffix, sql, limit in shown.sizes:
            items.append(f"{sql.replace('$c', quoted)} AS __size_{len(sizes)}")
            sizes.append((column + suffix, limit))
    return ", ".join(items), sizes


def _decode(row: dict[str, Any], sizes: Sequence[tuple[str, int]] = ()) -> dict[str, Any]:
    truncated: dict[str, int] = {}
    for i, (name, shown) in enumerate(sizes):
        size = row.pop(f"__size_{i}", None)
        if size is not None and size > shown:
            truncated[name] = int(size)
    for name in _JSON_COLUMNS:
        if name in row and isinstance(row[name], str):
            row[name] = json_object(row[name])
    for name in ("reward", "advantage"):
        value = row.get(name)
        if isinstance(value, float) and not math.isfinite(value):
            row[name] = None
    row["truncated"] = truncated
    return row


def json_object(text: str) -> dict[str, Any]:
    """A JSON column's object; {} for text that is not one (a file from another writer)."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def stream(sql: str, params: list[Any], tables: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """The query's rows as dicts, fetched FETCH_ROWS at a time (`tables`: Arrow tables it reads by name)."""
    cursor = connection().cursor()
    try:
        for name, table in (tables or {}).items():
            cursor.register(name, table)
        cursor.execute(sql, params)
        names = [d[0] for d in cursor.description]
        while rows := cursor.fetchmany(FETCH_ROWS):
            for values in rows:
                yield dict(zip(names, values, strict=True))
    finally:
        cursor.close()


# --- files a query cannot read ---------------------------------------------------------------------
# A query reads several files at once; when DuckDB refuses (a file that is not Parquet, lacks a column,
# or holds data it cannot decode) the files are split in halves and each half queried again, down to the
# files that fail alone: each is a gap naming it (`Gap.file`), and the query answers from the others.


def _unreadable(f: StoredFile, columns: Sequence[str]) -> Gap | None:
    """The gap of a file a query failed on alone, or None when the file itself reads well (then the query
    is at fault, and its error is no gap)."""
    reason = rollout_checks.unreadable_reason(f.location, columns, connection())
    if reason is None:
        return None
    return Gap(f.step, f"its rollout file {f.name} cannot be read: {reason}", file=f.name, run=f.run_id)


# `rollout_checks.list_values_problems` by (file, bytes, sha256): an announced file never changes, so its
# footer is read once per process.
_LIST_VERDICTS: OrderedDict[tuple[str, int, str], dict[str, str]] = OrderedDict()
MAX_LIST_VERDICTS = 65_536


def within_list_bounds(files: list[StoredFile], columns: Sequence[str], gaps: list[Gap] | None) -> list[StoredFile]:
    """The files whose footer allows their rows to be within the list bounds for `columns`; each other is a
    gap (its lists are never decoded: an old upload of millions of values in one rollout)."""
    lists = [c for c in columns if c in rollout_checks.LIST_VALUES_PER_ROW]
    if not lists:
        return files
    kept = []
    for f in files:
        key = (f.location, f.bytes, f.sha256)
        if key not in _LIST_VERDICTS:
            _LIST_VERDICTS[key] = rollout_checks.list_values_problems(f.location)
            if len(_LIST_VERDICTS) > MAX_LIST_VERDICTS:
                _LIST_VERDICTS.popitem(last=False)
        problem = next((_LIST_VERDICTS[key][c] for c in lists if c in _LIST_VERDICTS[key]), None)
        if problem is None:
            kept.append(f)
        elif gaps is not None:
            gaps.append(Gap(f.step, f"its rollout file {f.name} is not read: {problem}", file=f.name, run=f.run_id))
    return kept


def readable_stream(
    files: list[StoredFile],
    query: Callable[[list[StoredFile]], Iterator[dict[str, Any]]],
    columns: Sequence[str],
    gaps: list[Gap] | None,
) -> Iterator[dict[str, Any]]:
    """`query(files)`'s rows, leaving out the files it cannot read (each added to `gaps`). The query must
    read every file before its first row (ORDER BY, an aggregate): a failure after it is raised, and so is
    one on a file that reads well alone."""
    import duckdb

    if not files:
        return
    rows = query(files)
    try:
        first = next(rows)
    except StopIteration:
        return
    except duckdb.Error:
        if len(files) > 1:
            half = len(files) // 2
            yield from readable_stream(files[:half], query, columns, gaps)
            yield from readable_stream(files[half:], query, columns, gaps)
            return
        gap = _unreadable(files[0], columns)
        if gap is None:
            raise
        if gaps is not None:
            gaps.append(gap)
        return
    yield first
    yield from rows


def rollouts_query(
    run_ids: Sequence[RunId],
    *,
    filters: RolloutFilter | None = None,
    columns: Sequence[str] = TABLE_COLUMNS,
    limit: int | None = None,
    offset: int = 0,
    present: set[tuple[str, str]] | None = None,
    files: list[StoredFile] | None = None,
    gaps: list[Gap] | None = None,
    whole: Sequence[str] = (),
) -> Iterator[dict[str, Any]]:
    """The rollouts of `run_ids` matching `filters` as plain dicts (`run` plus `columns`, as SHOWN says,
    `whole` ones as stored, and `truncated`), ordered by run (as given), step and index, `offset` rows
    skipped and at most `limit` returned. Streams: the files are read a few at a time, in step order,
    until `limit` rows are out. Files the index names but the store lacks are left out (`present`: the
    (run, name) pairs known to exist; default: listed here); `run_rollout_gaps` names them. Files DuckDB
    cannot read are left out too, each added to `gaps`.

    The one reader of rollouts for every page and API: the run page's table, compare, review campaigns'
    copies, the samples API and the SDK."""
    filters = filters or RolloutFilter()
    if files is None:  # `files`: the index already read (the bench reads files it wrote itself)
        files = run_files(run_ids, filters.steps)
        if present is None:
            present = {(str(r), n) for r in dict.fromkeys(str(r) for r in run_ids) for n in existing_names(r)}
        files = [f for f in files if (f.run_id, f.name) in present]
    where, params = filters.where()
    select, sizes = _select(columns, whole)
    skip, left = offset, limit
    # A text search or a prompt: only the files their search index cannot rule out, consulted as we go.
    for chunk in rollout_index.candidate_chunks(connection(), files, filters.q, filters.prompt, FILES_PER_QUERY):
        if left is not None and left <= 0:
            return
        window = ""
        if left is not None:
            window = f" LIMIT {int(left) + int(skip)}"
        sql = (
            f"SELECT filename, {select} FROM read_parquet(?, filename = true) WHERE {where} "
            f'ORDER BY list_position(?, filename), step, "index"{window}'
        )

        def query(part: list[StoredFile], sql: str = sql) -> Iterator[dict[str, Any]]:
            locations = [f.location for f in part]
            return stream(sql, [locations, *params, locations])

        chunk = within_list_bounds(chunk, columns, gaps)
        run_of = {f.location: f.run_id for f in chunk}
        for row in readable_stream(chunk, query, _read_columns(columns, filters), gaps):
            if skip > 0:
                skip -= 1
                continue
            row["run"] = run_of.get(row.pop("filename"), "")
            yield _decode(row, sizes)
            if left is not None:
                left -= 1
                if left <= 0:
                    return


def _read_columns(columns: Sequence[str], filters: RolloutFilter) -> list[str]:
    """The file's columns a query reads (its own and its filters'), for naming what a file lacks."""
    filtered = ["step", "index", "reward", "advantage", "length", "finish_reason", "prompt", "group", "kept"]
    if filters.q:
        filtered += ["response", "label"]
    return list(dict.fromkeys([*columns, *filtered]))


def rollouts_count(
    run_ids: Sequence[RunId],
    filters: RolloutFilter | None = None,
    present: set[tuple[str, str]] | None = None,
    gaps: list[Gap] | None = None,
) -> int | None:
    """How many rollouts match: from the index alone with no filter but steps, from a scan of the
    filtered columns otherwise (files DuckDB cannot read left out, each added to `gaps`); None for a
    text search (it would read every response: the page pages with `next` instead)."""
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
    where, params = filters.where()

    def query(part: list[StoredFile]) -> Iterator[dict[str, Any]]:
        return stream(f"SELECT count(*) AS n FROM read_parquet(?) WHERE {where}", [[f.location for f in part], *params])

    return sum(int(row["n"]) for row in readable_stream(files, query, _read_columns((), filters), gaps))


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


def packed_view(row: dict[str, Any]) -> dict[str, Any]:
    """A rollout's per-token view as the dialog reads it: {text: [piece], <array>: base64 float16 (one
    value per piece), versions, and `truncated` when the query cut it: {column: its full length}}; {}
    when its step recorded none. The query cut each list at MAX_VIEW_TOKENS (rows_query's SHOWN); a row
    read otherwise is cut here."""
    text = row.get("token_text") or []
    if not text:
        return {}
    cut = {
        name: size
        for name, size in (row.get("truncated") or {}).items()
        if name.split(".")[0] in ("token_text", "versions", *VIEW_COLUMNS.values())
    }
    if len(text) > MAX_VIEW_TOKENS:
        cut.setdefault("token_text", len(text))
    view: dict[str, Any] = {"text": text[:MAX_VIEW_TOKENS]}
    for name, column in VIEW_COLUMNS.items():
        values = row.get(column)
        if values is not None:
            view[name] = pack_f16(values[:MAX_VIEW_TOKENS])
    if row.get("versions"):
        view["versions"] = [list(v) for v in row["versions"][:MAX_VIEW_TOKENS]]
    if cut:
        view["truncated"] = cut
    return view


def rollout_token_view(run_id: RunId, step: int, index: int) -> dict[str, Any]:
    """One rollout's per-token view ({text, <array>: base64 float16, versions, truncated}) and the
    responses to the same prompt at every step ([{step, index}], at most MAX_SAME_PROMPT), with the gaps
    of the files the same-prompt search could not read. NotFound names the rollout (and its file when
    that cannot be read)."""
    present = {(str(run_id), n) for n in existing_names(run_id)}
    gaps: list[Gap] = []
    rows = list(
        rollouts_query(
            [run_id],
            filters=RolloutFilter(steps=[step], index=index),
            columns=["prompt", "versions", "token_text", *VIEW_COLUMNS.values()],
            limit=1,
            present=present,
            gaps=gaps,
            whole=("prompt",),  # the same-prompt search matches it exactly (the file's bounds hold its size)
        )
    )
    if not rows:
        unreadable = f" ({gaps[0].reason})" if gaps else ""
        raise NotFound(f"run {run_id} has no rollout {index} at step {step}{unreadable}")
    found = rows[0]
    same = rollouts_query(
        [run_id],
        filters=RolloutFilter(prompt=found["prompt"]),
        columns=("step", "index"),
        limit=MAX_SAME_PROMPT,
        present=present,
        gaps=gaps,
    )
    return {
        "step": step,
        "index": index,
        "tokens": packed_view(found),
        "same_prompt": [{"step": r["step"], "index": r["index"]} for r in same],
        "gaps": gaps_payload(unique_gaps(gaps)),
    }


# --- gaps ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gap:
    """Rollouts a page cannot show: a step whose file is missing or unreadable (`file` names it)."""

    step: int
    reason: str
    file: str | None = None
    run: str | None = None


def unique_gaps(gaps: Sequence[Gap]) -> list[Gap]:
    """Each gap once (two queries of one request meet the same unreadable file), by run and step."""
    seen = {(g.run, g.step, g.file, g.reason): g for g in gaps}
    return sorted(seen.values(), key=lambda g: (g.run or "", g.step, g.file or ""))


def gaps_payload(gaps: Sequence[Gap], *, with_run: bool = False) -> list[dict[str, Any]]:
    """Gaps as the APIs answer them: {step, reason, file} (and `run` where an answer spans runs)."""
    return [{"step": g.step, "reason": g.reason, "file": g.file, **({"run": g.run} if with_run else {})} for g in gaps]


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
            out.gaps.append(
                Gap(
                    item["step"],
                    "its rollout file never arrived in the store (or was removed)",
                    file=item["name"],
                    run=str(run.pk),
                )
            )
    config: dict[str, Any] = run.resolved_config if isinstance(run.resolved_config, dict) else {}
    logging_cfg: dict[str, Any] = config["logging"] if isinstance(config.get("logging"), dict) else {}
    if not run.is_external and logging_cfg.get("samples", "all") == "all" and indexed_steps:
        keep = str(logging_cfg.get("rollouts_keep") or "all")
        expected = _expected_steps(keep, 1, max(indexed_steps))
        for step in sorted(expected - indexed_steps):
            out.gaps.append(
                Gap(step, "the engine trained this step but its rollout file was never announced", run=str(run.pk))
            )
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
    import duckdb

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
        except duckdb.Error:
            continue  # a file DuckDB cannot read: scanned (and named as a gap) by every query, never indexed
        written += 1
    return written


def rollout_index_build(run_id: RunId, name: str) -> None:
    """Writes the search index of one rollout file of the run (FileNotFoundError when the store lacks it)."""
    location = file_location(run_id, name)
    sha256, size = rollout_index.file_digest(location)
    text = rollout_index.index_text(connection(), _query_path(location), sha256, size)
    rollout_index.write_sidecar(run_id, name, text)
