"""The one reader of rollouts: a filtered, paged stream of rows over the run's files, and its count."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from posttrain.telemetry import rollout_index
from posttrain.telemetry.rollouts.db import connection, stream
from posttrain.telemetry.rollouts.files import StoredFile, run_files
from posttrain.telemetry.rollouts.filters import RolloutFilter
from posttrain.telemetry.rollouts.gaps import Gap
from posttrain.telemetry.rollouts.shown import _decode, _select
from posttrain.telemetry.rollouts.store import RunId, existing_names
from posttrain.telemetry.rollouts.unreadable import readable_stream, within_list_bounds
from posttrain_sdk import rollout_files

# Files per DuckDB query when a query walks a run's steps in order (stops once the page is full).
FILES_PER_QUERY = 16


# The columns of the rollout table: a rollout file's, less the async segments' policy versions (the per-token
# view is read on its own, for one rollout).
TABLE_COLUMNS = tuple(c for c in rollout_files.ROLLOUT_COLUMNS if c != "versions")


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
    (run, name) pairs known to exist; default: listed here); `run_rollout_files` names them. Files DuckDB
    cannot read are left out too, each added to `gaps`.

    The one reader of rollouts for every page and API: the run page's table, compare, review campaigns'
    copies, the samples API and the SDK."""
    filters = filters or RolloutFilter()
    if files is None:  # `files`: the index already read (the bench reads files it wrote itself)
        files = _present_files(run_ids, filters.steps, present)
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


def _present_files(
    run_ids: Sequence[RunId], steps: Sequence[int] | None, present: set[tuple[str, str]] | None
) -> list[StoredFile]:
    """The runs' indexed files at `steps` that the store has (`present`: the (run, name) pairs known to
    exist; default: listed here)."""
    files = run_files(run_ids, steps)
    if present is None:
        present = {(str(r), n) for r in dict.fromkeys(str(r) for r in run_ids) for n in existing_names(r)}
    return [f for f in files if (f.run_id, f.name) in present]


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
