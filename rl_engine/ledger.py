"""The prompt ledger: the fate of every training row in every epoch, so that a run resumed any number of
times can show it skipped nothing and trained nothing twice.

A row drawn for step `s` is *in flight* until that step resolves it as *trained* (some of its samples reached
the update: with the step, the ids of its samples in the step's rollout file and the policy-version span of
their tokens), *filtered* (every sample left out by a named filter: `dynamic_sampling`, `gibberish`,
`repetition`, `zero_advantage`) or *dropped* (`staleness`: a sample older than `backends.max_staleness`;
`lost_on_resume`: in flight at a checkpoint whose resume did not bring its rollouts back). A row of an epoch
the sampler has left that never got a fate is *skipped*; a row resolved twice in one epoch is a duplicate.
Both must stay 0, and `summary` counts them.

The state is a few integers per row, kept in the checkpoint's `engine_state.pt` (written atomically with it)
and after every step in the run folder as `ledger.parquet` (`LedgerFile`), which is also the export. A
resume restores the checkpoint's ledger; the run folder's file of the run that wrote the checkpoint tells
what the lost steps past it had done, recorded on the resume as re-done (`Resume`), never counted twice.
docs/ARCHITECTURE.md, "The prompt ledger".
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

LEDGER_FILE = "ledger.parquet"  # in the run folder
FILTER_REASONS = ("dynamic_sampling", "staleness", "gibberish", "repetition", "zero_advantage")
DROP_REASONS = frozenset({"staleness", "lost_on_resume"})
FATES = ("trained", "filtered", "dropped", "in_flight")


@dataclass(frozen=True)
class Draw:
    """One row drawn for a step: the dataset row in the epoch's shuffled order."""

    epoch: int
    row: int


@dataclass(frozen=True)
class SampleOutcome:
    """What the step did with one sample (its index in the step's rollout file)."""

    prompt_index: int  # into the step's draws
    kept: bool
    reason: str | None  # the filter or drop that left it out; None when kept
    versions: tuple[int, int]  # the oldest and newest policy version of its tokens
    reward_error: bool = False


@dataclass
class Entry:
    fate: str
    step: int  # the step that resolved it (in flight: the step it was drawn for)
    reason: str = ""
    sample_ids: list[int] = field(default_factory=list)
    trained_samples: int = 0
    version_min: int = -1
    version_max: int = -1
    reward_errors: int = 0


@dataclass
class Resume:
    """One resume: the checkpoint's step, what it restored, and what it re-does (the steps a crash or a
    preemption past its deadline lost after that checkpoint: their rows are trained again, once)."""

    checkpoint_step: int
    restored_in_flight: int  # rows generated ahead, restored with their rollouts
    lost_in_flight: int  # rows in flight whose rollouts were not restored (dropped, `lost_on_resume`)
    redone_steps: list[int]  # steps past the checkpoint the interrupted run had finished
    redone_rows: int  # rows those steps had resolved, resolved again after the resume
    seconds: float = 0.0  # from the process start to the first step after the resume


class PromptLedger:
    def __init__(self, dataset_rows: int):
        self.dataset_rows = dataset_rows
        self.entries: dict[tuple[int, int], Entry] = {}
        self.duplicates: list[tuple[int, int, int]] = []  # (epoch, row, step) resolved a second time
        self.resumes: list[Resume] = []
        self.sampler_epoch = 0  # the epoch the sampler is in: every earlier one is complete

    # --- writes ------------------------------------------------------------------------------------------

    def draw(self, step: int, draws: Sequence[Draw]) -> None:
        """`draws` were taken from the sampler for `step`: in flight until that step resolves them."""
        for draw in draws:
            key = (draw.epoch, draw.row)
            if key in self.entries and self.entries[key].fate != "in_flight":
                self.duplicates.append((draw.epoch, draw.row, step))
            self.entries[key] = Entry("in_flight", step)
            self.sampler_epoch = max(self.sampler_epoch, draw.epoch)

    def resolve(self, step: int, draws: Sequence[Draw], outcomes: Sequence[SampleOutcome]) -> None:
        """Step `step` has decided its samples: each drawn row becomes trained, filtered or dropped."""
        by_prompt: dict[int, list[tuple[int, SampleOutcome]]] = {}
        for sample_id, outcome in enumerate(outcomes):
            by_prompt.setdefault(outcome.prompt_index, []).append((sample_id, outcome))
        for index, draw in enumerate(draws):
            key = (draw.epoch, draw.row)
            current = self.entries.get(key)
            if current is not None and current.fate != "in_flight":
                self.duplicates.append((draw.epoch, draw.row, step))
            samples = by_prompt.get(index, [])
            self.entries[key] = _resolved(step, samples)

    def restore_in_flight(self, restored_steps: set[int]) -> tuple[int, int]:
        """On resume: rows in flight for a step whose batch came back with the checkpoint stay in flight;
        any other in-flight row is dropped as `lost_on_resume`. Returns (restored, lost)."""
        restored = lost = 0
        for entry in self.entries.values():
            if entry.fate != "in_flight":
                continue
            if entry.step in restored_steps:
                restored += 1
            else:
                entry.fate, entry.reason = "dropped", "lost_on_resume"
                lost += 1
        return restored, lost

    # --- reads ---------------------------------------------------------------------------------------------

    def summary(self) -> list[dict[str, Any]]:
        """Per epoch: rows trained, filtered and dropped by reason, in flight, not drawn yet, skipped (an
        epoch the sampler left with rows that never got a fate) and duplicates."""
        epochs: dict[int, Counter[str]] = {}
        for (epoch, _), entry in self.entries.items():
            label = entry.fate if entry.fate in ("trained", "in_flight") else f"{entry.fate}:{entry.reason}"
            epochs.setdefault(epoch, Counter())[label] += 1
        duplicated = Counter(epoch for epoch, _, _ in self.duplicates)
        out = []
        for epoch in range(max([*epochs, self.sampler_epoch]) + 1 if epochs else 0):
            counts = epochs.get(epoch, Counter())
            accounted = sum(counts.values())
            missing = self.dataset_rows - accounted
            out.append(
                {
                    "epoch": epoch,
                    "rows": self.dataset_rows,
                    "trained": counts["trained"],
                    "filtered": _by_reason(counts, "filtered"),
                    "dropped": _by_reason(counts, "dropped"),
                    "in_flight": counts["in_flight"],
                    "not_drawn": missing if epoch >= self.sampler_epoch else 0,
                    "skipped": missing if epoch < self.sampler_epoch else 0,
                    "duplicates": duplicated[epoch],
                }
            )
        return out

    def trained_keys(self) -> set[tuple[int, int]]:
        return {key for key, entry in self.entries.items() if entry.fate == "trained"}

    def staleness_violations(self, max_staleness: int) -> int:
        """Trained rows with a token sampled more than `max_staleness` versions before the trainer's (the
        trainer is version `step - 1` at step `step`)."""
        return sum(
            1
            for entry in self.entries.values()
            if entry.fate == "trained" and entry.version_min >= 0 and entry.step - 1 - entry.version_min > max_staleness
        )

    # --- state -------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Columnar: a handful of integers per row, as the checkpoint keeps it."""
        keys = sorted(self.entries)
        entries = [self.entries[k] for k in keys]
        return {
            "dataset_rows": self.dataset_rows,
            "sampler_epoch": self.sampler_epoch,
            "epoch": [k[0] for k in keys],
            "row": [k[1] for k in keys],
            **{name: [getattr(e, name) for e in entries] for name in Entry.__dataclass_fields__},
            "duplicates": [list(d) for d in self.duplicates],
            "resumes": [asdict(r) for r in self.resumes],
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> PromptLedger:
        ledger = cls(int(state["dataset_rows"]))
        ledger.sampler_epoch = int(state["sampler_epoch"])
        columns = [state[name] for name in Entry.__dataclass_fields__]
        for epoch, row, *values in zip(state["epoch"], state["row"], *columns, strict=True):
            ledger.entries[(epoch, row)] = Entry(*values)
        ledger.duplicates = [(int(a), int(b), int(c)) for a, b, c in state["duplicates"]]
        ledger.resumes = [Resume(**r) for r in state["resumes"]]
        return ledger

    def write_parquet(self, path: Path) -> None:
        """The whole ledger as a Parquet table (a row per (epoch, row) with a fate), its summary and resumes
        in the file's metadata; written to a temporary name and renamed, so a reader never sees half."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        state = self.state_dict()
        columns = ["epoch", "row", *Entry.__dataclass_fields__]
        table = pa.table({name: state[name] for name in columns})
        metadata = {
            "dataset_rows": str(self.dataset_rows),
            "sampler_epoch": str(self.sampler_epoch),
            "summary": json.dumps(self.summary()),
            "resumes": json.dumps(state["resumes"]),
            "duplicates": json.dumps(state["duplicates"]),
        }
        table = table.replace_schema_metadata({k.encode(): v.encode() for k, v in metadata.items()})
        partial = path.with_name(path.name + ".partial")
        pq.write_table(table, partial)
        os.replace(partial, path)


class LedgerFile:
    """The run folder's `ledger.parquet`, rewritten after a step unless the last write was recent: at most one
    write per `spacing` times its own duration (a few milliseconds for thousands of rows: every step), so a
    ledger of millions of rows costs a run a few percent at most. `force` (a checkpoint, a resume, the end)
    always writes."""

    def __init__(self, path: Path, spacing: float = 20.0):
        self.path, self.spacing = path, spacing
        self._next_at = 0.0

    def save(self, ledger: PromptLedger, force: bool = False) -> None:
        started = time.monotonic()
        if not force and started < self._next_at:
            return
        ledger.write_parquet(self.path)
        ended = time.monotonic()
        self._next_at = ended + self.spacing * (ended - started)


def read_parquet(path: Path) -> PromptLedger:
    """A ledger back from its Parquet file (`PromptLedger.write_parquet`)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    metadata = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    state: dict[str, Any] = table.to_pydict()
    state.update(
        dataset_rows=int(metadata["dataset_rows"]),
        sampler_epoch=int(metadata["sampler_epoch"]),
        resumes=json.loads(metadata["resumes"]),
        duplicates=json.loads(metadata["duplicates"]),
    )
    return PromptLedger.from_state_dict(state)


def read_metadata(path: Path) -> dict[str, Any]:
    """The ledger file's summary, resumes and duplicates from its footer alone (the rows are not read)."""
    import pyarrow.parquet as pq

    raw = pq.read_schema(path).metadata or {}
    metadata = {k.decode(): v.decode() for k, v in raw.items()}
    return {
        "dataset_rows": int(metadata["dataset_rows"]),
        "sampler_epoch": int(metadata["sampler_epoch"]),
        "epochs": json.loads(metadata["summary"]),
        "resumes": json.loads(metadata["resumes"]),
        "duplicates": json.loads(metadata["duplicates"]),
    }


def redone_since(previous: PromptLedger | None, checkpoint_step: int) -> tuple[list[int], int]:
    """What the interrupted run had resolved after its checkpoint (from its run folder's ledger): the steps,
    and how many rows they resolved. Those rows are in flight or not yet drawn in the checkpoint's ledger."""
    if previous is None:
        return [], 0
    later = [e for e in previous.entries.values() if e.fate != "in_flight" and e.step > checkpoint_step]
    return sorted({e.step for e in later}), len(later)


def _resolved(step: int, samples: list[tuple[int, SampleOutcome]]) -> Entry:
    kept = [(i, o) for i, o in samples if o.kept]
    entry = Entry(
        "trained" if kept else "filtered",
        step,
        sample_ids=[i for i, _ in samples],
        trained_samples=len(kept),
        reward_errors=sum(o.reward_error for _, o in samples),
    )
    counted = kept or samples
    if counted:
        entry.version_min = min(o.versions[0] for _, o in counted)
        entry.version_max = max(o.versions[1] for _, o in counted)
    if not kept:
        # The reason that left out most of its samples (a group estimator drops them together: one reason).
        reasons = Counter(o.reason or "unknown" for _, o in samples)
        entry.reason = reasons.most_common(1)[0][0] if reasons else "no_samples"
        if entry.reason in DROP_REASONS:
            entry.fate = "dropped"
    return entry


def _by_reason(counts: Counter[str], fate: str) -> dict[str, int]:
    prefix = f"{fate}:"
    return {label[len(prefix) :]: n for label, n in sorted(counts.items()) if label.startswith(prefix)}
