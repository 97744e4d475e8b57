"""A run's prompt ledger, platform side: the file its engine keeps in the run folder (`ledger.parquet`,
rewritten after every step; rl_engine/ledger.py), its summary read from the file's footer alone, and the
file itself for the export. A resumed run's folder holds the whole history, the runs it resumed included
(the ledger travels in the checkpoint)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from posttrain.core.errors import NotFound, PayloadTooLarge
from posttrain.runs.models import Run
from posttrain.runs.services.launch import run_dir_for
from rl_engine.spec.ledger import LEDGER_FILE, read_metadata

TOTALS = ("trained", "in_flight", "not_drawn", "skipped", "duplicates")


@dataclass(frozen=True)
class LedgerFile:
    path: Path
    bytes: int


def run_ledger_file(run: Run) -> LedgerFile:
    """The run's ledger file in the folder the platform gave the run (never a path a config or an event
    names), its size checked against `LEDGER_MAX_BYTES` before anything reads it."""
    path = run_dir_for(run.pk) / LEDGER_FILE
    if run.is_external or not path.is_file():
        why = "an external run has none" if run.is_external else "its engine writes one after its first step"
        raise NotFound(f"run {run.pk} has no prompt ledger ({why})")
    size = path.stat().st_size
    if size > settings.LEDGER_MAX_BYTES:
        raise PayloadTooLarge(f"run {run.pk}'s ledger is {size} bytes, over the {settings.LEDGER_MAX_BYTES} served")
    return LedgerFile(path, size)


def run_ledger_summary(run: Run) -> dict[str, Any]:
    """Per epoch: rows trained, filtered and dropped by reason, in flight, not drawn yet, skipped and
    duplicated; each resume with what it restored and re-did; totals over the epochs."""
    file = run_ledger_file(run)
    ledger = read_metadata(file.path)
    epochs = ledger["epochs"]
    totals: dict[str, Any] = {key: sum(e[key] for e in epochs) for key in TOTALS}
    for fate in ("filtered", "dropped"):
        totals[fate] = sum(sum(e[fate].values()) for e in epochs)
    return {
        "dataset_rows": ledger["dataset_rows"],
        "epochs": epochs,
        "resumes": ledger["resumes"],
        "totals": totals,
        "bytes": file.bytes,
    }
