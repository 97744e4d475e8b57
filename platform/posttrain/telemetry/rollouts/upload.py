"""An external run's rollout file upload: refused to an ended run and for an announced name, staged,
checked and put in place."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.db import transaction

from posttrain.core.errors import Conflict, IllegalTransition
from posttrain.runs.models import TERMINAL_STATES, Run, RunState
from posttrain.runs.services.state_machine import run_revive_lost
from posttrain.telemetry import rollout_checks
from posttrain.telemetry.models import RolloutFile
from posttrain.telemetry.rollouts.store import RunId, file_location
from posttrain_sdk import rollout_files


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
