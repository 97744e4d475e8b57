"""Where a run's rollout files are in the store (a local folder or an fsspec URL), which it holds, and
opening one."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from django.conf import settings

from posttrain.core.errors import NotFound
from posttrain.runs.locations import rollout_folder
from posttrain_sdk import rollout_files

RunId = uuid.UUID | str


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


def open_file(run_id: RunId, name: str) -> Any:
    """A rollout file opened for reading (the export streams it)."""
    fs, path = rollout_files.split_url(file_location(run_id, name))
    try:
        return open(path, "rb") if fs is None else fs.open(path, "rb")
    except FileNotFoundError:
        raise NotFound(f"the rollout file {name} of run {run_id} is not in the store") from None
