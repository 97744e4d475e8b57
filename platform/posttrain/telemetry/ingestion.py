"""Event ingestion: a validated batch from a run's engine stored exactly once (seq order, no gaps),
metrics appended to the column store, the engine's status events applied to the state machine, and
the batch published on the live channel after commit."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from posttrain.core import dispatch
from posttrain.core.errors import InvalidInput, SeqConflict
from posttrain.runs.models import Checkpoint, Run
from posttrain.runs.services.state_machine import S, run_revive_lost, run_transition
from posttrain.telemetry import hooks, live_channel, rollout_index, series
from posttrain.telemetry.alerts import alerts_notify_after_commit
from posttrain.telemetry.event_schema import parse_batch
from posttrain.telemetry.models import MetricRow, RolloutFile, RunLog
from posttrain_sdk.event_log import EVENTS_FILE, read_events

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestResult:
    acknowledged_seq: int
    stored: int


def events_ingest(run_id: uuid.UUID | str, events: list[dict[str, Any]], *, touch: bool = True) -> IngestResult:
    """Store a validated batch (see event_schema.parse_batch) exactly once.

    Events arrive contiguously: under the run's row lock, events with seq <= last_seq are already
    stored and dropped (this is what makes a retried batch harmless); the rest must continue at
    last_seq + 1 without gaps, else SeqConflict (409 with `expected_seq`) and nothing is stored."""
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        new = [e for e in events if e["seq"] > run.last_seq]
        _check_contiguous(new, run.last_seq + 1)
        update: dict[str, Any] = {"last_event_at": now} if touch else {}
        if new:
            _store_new_events(run, new, update)
        if update:
            Run.objects.filter(pk=run.pk).update(**update)
        for event in new:
            if event["type"] == "status":
                _apply_engine_status(run.pk, event["data"])
        if new:
            _notify_after_commit(run, new)
        return IngestResult(acknowledged_seq=update.get("last_seq", run.last_seq), stored=len(new))


def _check_contiguous(new: list[dict[str, Any]], expected: int) -> None:
    """SeqConflict unless the new events' seqs run from `expected` on without gaps."""
    for offset, event in enumerate(new):
        if event["seq"] != expected + offset:
            raise SeqConflict(
                expected,
                f"events must continue at seq {expected} without gaps; got seq {event['seq']} "
                f"where {expected + offset} was expected",
            )


def _store_new_events(run: Run, new: list[dict[str, Any]], update: dict[str, Any]) -> None:
    """Store a non-empty batch of new events (under the run's row lock) and add to `update` what
    the run's row gets from them: its summary, last seq and last step."""
    if run.state == S.FAILED:
        run_revive_lost(run.pk)  # the client was only silent, not gone
    summary = _store_events(run, new)
    if summary is not run.summary:
        update["summary"] = summary
    steps = [e["step"] for e in new if e.get("step") is not None]
    update["last_seq"] = new[-1]["seq"]
    if steps:
        update["last_step"] = max(steps + ([run.last_step] if run.last_step is not None else []))


def _notify_after_commit(run: Run, new: list[dict[str, Any]]) -> None:
    """Once the transaction commits: the new events to the live channel, and alerts if metrics came."""
    transaction.on_commit(lambda: live_channel.publish(run.pk, new))
    if any(event["type"] == "metrics" for event in new):
        alerts_notify_after_commit(run)  # critical alerts to the experiment's webhook, if it has one


def _store_events(run: Run, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Insert the events' rows; returns the run summary with the batch's metrics (the same object
    when the batch has none)."""
    metrics, metric_events, checkpoints, logs = [], [], [], []
    files: list[RolloutFile] = []
    pruned: list[str] = []
    for e in events:
        kind, data = e["type"], e["data"]
        # Metrics, samples and checkpoint events have their step (event_schema requires it); a log's is optional.
        if kind == "metrics":
            metrics.append(MetricRow(run=run, seq=e["seq"], step=e["step"], time=e["time"], values=data))
            metric_events.append(e)
        elif kind == "samples":  # a reference to the step's rollout file: no row per rollout
            files.append(_rollout_file(run, e["seq"], e["step"], data))
            pruned.extend(data.get("pruned") or [])
        elif kind == "checkpoint":
            checkpoints.append(Checkpoint(run=run, seq=e["seq"], step=e["step"], path=data["path"]))
        elif kind == "log":
            logs.append(
                RunLog(
                    run=run,
                    seq=e["seq"],
                    step=e.get("step"),
                    time=e["time"],
                    level=data.get("level", "info"),
                    message=data["message"],
                )
            )
    MetricRow.objects.bulk_create(metrics, batch_size=1000)
    summary = series.append_metrics(run.pk, run.summary, metric_events)  # the column store the charts read
    # (run, step, part) is unique: a step recorded twice (an engine re-running a step into the same run)
    # keeps its first file rather than refusing the whole batch.
    RolloutFile.objects.bulk_create(files, ignore_conflicts=True)
    if files:  # the new files' search index, built by a worker (never in this request)
        # robust: the events are stored; a broker that is down costs the index (files without one are
        # scanned, and the next samples event or `manage.py rollout_index` builds it), never the request.
        transaction.on_commit(lambda: dispatch.run_task("rollout_index_update", run.pk), robust=True)
    if pruned:  # the engine's retention (logging.rollouts_keep) removed these files
        RolloutFile.objects.filter(run=run, name__in=pruned).delete()
        transaction.on_commit(lambda: rollout_index.rollout_index_remove(run.pk, pruned), robust=True)
    Checkpoint.objects.bulk_create(checkpoints, ignore_conflicts=True)
    RunLog.objects.bulk_create(logs, batch_size=1000)
    return summary


def _rollout_file(run: Run, seq: int, step: int, data: dict[str, Any]) -> RolloutFile:
    return RolloutFile(
        run=run,
        seq=seq,
        step=step,
        part=data.get("part", 0),
        name=data["file"],
        rows=data["rows"],
        bytes=data["bytes"],
        sha256=data.get("sha256", ""),
        stats=data.get("stats") or {},
    )


def _apply_engine_status(run_id: uuid.UUID, data: dict[str, Any]) -> None:
    """The engine's own status events drive running and the terminal states it knows about."""
    state, reason = data["state"], data.get("reason") or ""
    if state == "running":
        resumed = data.get("resumed_from")
        run_transition(
            run_id,
            [S.QUEUED, S.STARTING],
            S.RUNNING,
            f"engine started (resuming from {resumed})" if resumed else "engine started",
        )
    elif state == "succeeded":
        run_transition(
            run_id,
            [S.QUEUED, S.STARTING, S.RUNNING, S.CANCELLING, S.PREEMPTING],
            S.SUCCEEDED,
            reason or "engine finished every step",
        )
    elif state == "preempted":
        # Asked by the scheduler (preempting), or by someone else's request file while running: either
        # way the engine checkpointed and is leaving, and the run goes back to the queue to resume.
        run_transition(run_id, [S.RUNNING], S.PREEMPTING, "the engine stopped for a preemption request")
        note = f"preempted: {reason}" if reason else "preempted"
        if not hooks.preemptions().settle(run_id, data.get("checkpoint"), note):
            run_transition(run_id, [S.CANCELLING], S.CANCELLED, f"cancelled (engine: preempted, {reason})")
    elif state == "failed" and hooks.preemptions().stopped_at_deadline(run_id):
        return  # its job was stopped for the scheduler: the reconcile settles it as preempted
    elif state == "failed" and not run_transition(
        run_id, [S.QUEUED, S.STARTING, S.RUNNING, S.PREEMPTING], S.FAILED, reason or "engine reported a failure"
    ):
        # Stopping a job can surface as an engine failure (an interrupt): the user asked for it.
        run_transition(run_id, [S.CANCELLING], S.CANCELLED, f"cancelled (engine: {reason})" if reason else "cancelled")


def events_recover_from_run_folder(run: Run) -> int:
    """After the job ended: store any events of the run folder's events.jsonl the platform never got
    (the engine could not deliver them before it exited). Needs the storage shared with the cluster;
    otherwise there is nothing to read and nothing happens."""
    run_dir = (run.resolved_config or {}).get("logging", {}).get("run_dir")
    if not run_dir:
        return 0
    path = Path(run_dir) / EVENTS_FILE
    try:
        events = [e for e in read_events(path) if isinstance(e, dict) and isinstance(e.get("seq"), int)]
    except (OSError, ValueError):
        logger.warning("cannot read %s to recover events of run %s", path, run.pk, exc_info=True)
        return 0
    run.refresh_from_db(fields=["last_seq"])
    missing = [e for e in events if e["seq"] > run.last_seq]
    stored = 0
    for start in range(0, len(missing), 500):
        try:
            chunk = parse_batch({"events": missing[start : start + 500]}, str(run.pk))
            stored += events_ingest(run.pk, chunk, touch=False).stored
        except (InvalidInput, SeqConflict) as exc:
            logger.warning("recovering events of run %s from %s stopped: %s", run.pk, path, exc)
            break
    if stored:
        logger.info("recovered %d events of run %s from %s", stored, run.pk, path)
    return stored
