"""The rollout store, platform side: where a run's rollout files are, and every read of them, queried in
place with DuckDB (embedded; nothing downloaded at run time). docs/ROLLOUTS.md describes the layout.

Postgres keeps one `RolloutFile` row per step file (name, rows, bytes, statistics); the rows themselves
stay in the Parquet files. Queries list a run's files from that index and read only the columns and
row groups they need; results stream (`fetchmany`), and a query ordered by step reads the files a few
at a time and stops once its page is full, so the web process never holds a whole step, let alone a
run. A file the index names but the store lacks is reported as a gap (`run_rollout_files`), never
skipped silently.

Text search matches a case-insensitive substring of the prompt, the response or the label (both sides
lower-cased by DuckDB), scanning the files in step order until the page is full. A text search and a
same-prompt query first consult each file's search index (`posttrain.telemetry.rollout_index`) and read only
the files that can match: a word no rollout holds reads no file at all (measured in
bench/rollout_store.py).

The modules, one concept each: `store` (where the files are), `upload` (an external run's upload), `db` (the
DuckDB connection), `files` (the index's files the store holds), `filters` (RolloutFilter), `shown` (what an
answer shows of a row), `unreadable` (files a query cannot read), `gaps`, `query` (`rollouts_query`,
`rollouts_count`), `token_view` (one rollout's per-token view) and `indexing` (building the search index).
"""

from posttrain.telemetry.rollouts.db import connection, reset_connections, stream
from posttrain.telemetry.rollouts.files import StoredFile, present_files, run_files
from posttrain.telemetry.rollouts.filters import RolloutFilter
from posttrain.telemetry.rollouts.gaps import Gap, gaps_payload, run_rollout_files, unique_gaps
from posttrain.telemetry.rollouts.indexing import rollout_index_build, rollout_index_update
from posttrain.telemetry.rollouts.query import rollouts_count, rollouts_query
from posttrain.telemetry.rollouts.shown import (
    ERROR_CHARS,
    ERRORS_SHOWN,
    JSON_CHARS,
    MAX_VIEW_TOKENS,
    SHOWN,
    TEXT_CHARS,
    json_object,
)
from posttrain.telemetry.rollouts.store import RunId, existing_names, open_file, rollout_folder
from posttrain.telemetry.rollouts.token_view import (
    MAX_SAME_PROMPT,
    VIEW_COLUMNS,
    pack_f16,
    packed_view,
    rollout_token_view,
)
from posttrain.telemetry.rollouts.unreadable import readable_stream
from posttrain.telemetry.rollouts.upload import rollout_upload

__all__ = [
    "ERRORS_SHOWN",
    "ERROR_CHARS",
    "JSON_CHARS",
    "MAX_SAME_PROMPT",
    "MAX_VIEW_TOKENS",
    "SHOWN",
    "TEXT_CHARS",
    "VIEW_COLUMNS",
    "Gap",
    "RolloutFilter",
    "RunId",
    "StoredFile",
    "connection",
    "existing_names",
    "gaps_payload",
    "json_object",
    "open_file",
    "pack_f16",
    "packed_view",
    "present_files",
    "readable_stream",
    "reset_connections",
    "rollout_folder",
    "rollout_index_build",
    "rollout_index_update",
    "rollout_token_view",
    "rollout_upload",
    "rollouts_count",
    "rollouts_query",
    "run_files",
    "run_rollout_files",
    "stream",
    "unique_gaps",
]
