"""Files a query cannot read: left out of the answer, each named as a gap."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from posttrain.telemetry import rollout_checks
from posttrain.telemetry.rollouts.db import connection
from posttrain.telemetry.rollouts.files import StoredFile
from posttrain.telemetry.rollouts.gaps import Gap

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
