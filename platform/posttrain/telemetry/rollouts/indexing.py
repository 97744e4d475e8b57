"""Building the search index (posttrain.telemetry.rollout_index) of a run's rollout files: a worker's task."""

from __future__ import annotations

from posttrain.telemetry import rollout_index
from posttrain.telemetry.rollouts.db import connection
from posttrain.telemetry.rollouts.files import run_files
from posttrain.telemetry.rollouts.store import RunId, _query_path, existing_names, file_location


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
