"""The web process's DuckDB: one bounded connection per thread, and a query's rows streamed as dicts."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from posttrain.telemetry.rollouts.store import _filesystem

FETCH_ROWS = 256
# The web process's DuckDB: two threads, bounded memory (spills nothing: queries are streaming scans).
DUCKDB_THREADS = 2
DUCKDB_MEMORY_LIMIT = "512MB"

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
