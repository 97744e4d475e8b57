"""The engine's rollout files: each step's rollouts and their per-token view written as one Parquet file
(`posttrain_sdk.rollout_files`) from the engine's own tensors, on a background thread, and announced by a
`samples` event that carries the file's name and statistics instead of the rows.

The record stage hands over references (`StepRollouts`: the records, the samples, the training batch's
tensors); building the table, compressing and writing happen on the writer's thread, off the step's
critical path. The queue holds at most `MAX_PENDING` steps: a writer that falls behind (a slow bucket)
slows the loop down instead of holding every step in memory. A file that cannot be written is a `log`
warning naming the step, and no `samples` event: the platform shows the step's rollouts as missing.

Retention (`logging.rollouts_keep`): `all`, `every K` (only steps divisible by K are written) or
`last N` (older files are deleted as new ones land; the event names the files it removed).
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from posttrain_sdk import rollout_files

if TYPE_CHECKING:
    import pyarrow as pa

    from posttrain_sdk.event_log import EventLog
    from rl_engine.rollout import Sample

logger = logging.getLogger(__name__)

MAX_PENDING = 2
KEEP_PATTERN = r"^(all|every [1-9][0-9]*|last [1-9][0-9]*)$"


@dataclass(frozen=True)
class Retention:
    mode: str  # all | every | last
    n: int = 0

    @classmethod
    def parse(cls, text: str) -> Retention:
        text = " ".join(text.split())
        if not re.match(KEEP_PATTERN, text):
            raise ValueError(f"rollouts_keep: expected 'all', 'every K' or 'last N', got {text!r}")
        mode, _, n = text.partition(" ")
        return cls(mode, int(n or 0))

    def writes(self, step: int) -> bool:
        return self.mode != "every" or step % self.n == 0


@dataclass
class StepRollouts:
    """What the record stage hands to the writer: references, no copies. `rows` are the kept samples'
    indices in the step (the training batch's rows), and the `[B, T]` tensors are the batch's, or None
    where the step did not compute them."""

    step: int
    records: list[dict[str, Any]]
    samples: list[Sample]
    prompt_ids: list[Sequence[int]]  # per sample: its prompt's token ids
    token_view: bool  # the per-token columns are written for this step (logging.token_view_every)
    rows: torch.Tensor | None = None
    response_attention: torch.Tensor | None = None  # [B, T] 1 on the response's tokens (observations too)
    batch_tensors: dict[str, torch.Tensor | None] = field(default_factory=dict)  # column name -> [B, T]

    def __len__(self) -> int:
        return len(self.records)


class PieceCache:
    """Each token id's text piece (what `tokenizer.decode([id])` gives), decoded once per id."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.pieces: dict[int, str] = {}

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        unique, inverse = np.unique(ids, return_inverse=True)
        missing = [int(i) for i in unique if int(i) not in self.pieces]
        if missing:
            for token, piece in zip(missing, self.tokenizer.batch_decode([[i] for i in missing])):
                self.pieces[token] = piece
        table = np.array([self.pieces[int(i)] for i in unique], dtype=object)
        return table[inverse] if ids.size else np.array([], dtype=object)


def _list_array(values: np.ndarray, lengths: np.ndarray, valid: np.ndarray | None, value_type: Any) -> pa.Array:
    """A list column from flat values and per-row lengths; rows where `valid` is False are null."""
    import pyarrow as pa

    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    mask = None if valid is None else pa.array(~valid)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=value_type), mask=mask)


def _flat(lists: Sequence[Sequence[Any] | None], dtype: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat values, lengths, valid) of per-row lists, None rows empty and invalid."""
    lengths = np.array([0 if x is None else len(x) for x in lists], dtype=np.int64)
    valid = np.array([x is not None for x in lists], dtype=bool)
    total = int(lengths.sum())
    flat = np.fromiter((v for x in lists if x is not None for v in x), dtype=dtype, count=total)
    return flat, lengths, valid


def step_table(rollouts: StepRollouts, pieces: PieceCache | None) -> pa.Table:
    """The step's table: the records as rows, plus the per-token columns when the step records them."""
    import pyarrow as pa

    columns: dict[str, Any] = {}
    if rollouts.token_view:
        samples, n = rollouts.samples, len(rollouts.samples)
        ids, lengths, _ = _flat([s.response_ids for s in samples], np.int32)
        columns["token_ids"] = _list_array(ids, lengths, None, pa.int32())
        prompt_ids, prompt_lengths, _ = _flat(rollouts.prompt_ids, np.int32)
        columns["prompt_token_ids"] = _list_array(prompt_ids, prompt_lengths, None, pa.int32())
        masks = [s.action_mask for s in samples]
        if any(m is not None for m in masks):
            full = [m if m is not None else (1,) * len(s.response_ids) for m, s in zip(masks, samples)]
            flat, mask_lengths, _ = _flat(full, np.int8)
            columns["action_mask"] = _list_array(flat, mask_lengths, None, pa.int8())
        if pieces is not None:
            columns["token_text"] = _list_array(pieces.lookup(ids), lengths, None, pa.string())
        for name, attribute in (("rollout_logprob", "logprobs"), ("entropy", "entropies")):
            per_sample = [getattr(s, attribute) for s in samples]
            if any(v is not None for v in per_sample):
                flat, value_lengths, valid = _flat(per_sample, np.float32)
                columns[name] = _list_array(flat, value_lengths, valid, pa.float32())
        rows, attention = rollouts.rows, rollouts.response_attention
        if rows is not None and attention is not None:
            columns.update(_batch_columns(rollouts, rows, attention, n))
    return rollout_files.rows_table(rollouts.records, rollouts.step, columns)


def _batch_columns(
    rollouts: StepRollouts, kept_rows: torch.Tensor, response_attention: torch.Tensor, n: int
) -> dict[str, pa.Array]:
    """The training batch's `[B, T]` tensors as list columns over the step's n rows: each kept row's
    values on its response tokens (the step's `rows` and `response_attention`), null for the rows that did
    not train."""
    import pyarrow as pa

    rows = kept_rows.tolist()
    attention = response_attention.bool()
    kept_lengths = attention.sum(1).tolist()
    lengths = np.zeros(n, dtype=np.int64)
    lengths[rows] = kept_lengths
    valid = np.zeros(n, dtype=bool)
    valid[rows] = True
    # Batch rows are in step order (kept rows ascending), so the flattened values are in row order too.
    order = np.argsort(rows, kind="stable")
    out = {}
    for name, tensor in rollouts.batch_tensors.items():
        if tensor is None:
            continue
        per_row = [tensor[i][attention[i]] for i in order.tolist()]
        flat = torch.cat(per_row).float().numpy() if per_row else np.zeros(0, dtype=np.float32)
        out[name] = _list_array(flat, lengths, valid, pa.float32())
    return out


class RolloutWriter:
    """Writes each step's rollout file on a thread of its own and emits its `samples` event."""

    def __init__(
        self,
        sink: EventLog,
        folder: str,
        keep: str = "all",
        tokenizer: Any = None,
        metadata: dict[str, str] | None = None,
    ):
        self.sink = sink
        self.folder = folder
        self.retention = Retention.parse(keep)
        self.pieces = PieceCache(tokenizer) if tokenizer is not None else None
        self.metadata = metadata or {}
        self.written: list[str] = []
        self.seconds: list[float] = []  # per step: building, encoding and writing the file
        self._queue: queue.Queue[StepRollouts | None] = queue.Queue(maxsize=MAX_PENDING)
        self._thread = threading.Thread(target=self._run, name="rollout-writer", daemon=True)
        self._thread.start()

    def submit(self, rollouts: StepRollouts) -> None:
        """Hands a step over (blocks only while MAX_PENDING steps are still being written)."""
        if self.retention.writes(rollouts.step):
            self._queue.put(rollouts)

    def flush(self) -> None:
        """Waits until every step submitted so far is written and announced (before a checkpoint, so that
        a run resumed from it has the `samples` event of every step up to it)."""
        if self._thread.is_alive():
            self._queue.join()

    def close(self) -> None:
        """Waits until every submitted step is written (its event emitted)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _run(self) -> None:
        while True:
            rollouts = self._queue.get()
            if rollouts is None:
                self._queue.task_done()
                return
            try:
                self._write(rollouts)
            except Exception as exc:  # a full disk, a bucket refusing: the step is a gap the page names
                logger.exception("rollout file of step %s not written", rollouts.step)
                self.sink.emit(
                    "log",
                    {
                        "level": "warning",
                        "message": f"the rollouts of step {rollouts.step} were not stored: {type(exc).__name__}: {exc}"[
                            :2000
                        ],
                    },
                    step=rollouts.step,
                )
            finally:
                self._queue.task_done()

    def _write(self, rollouts: StepRollouts) -> None:
        started = time.perf_counter()
        table = step_table(rollouts, self.pieces)
        info = rollout_files.write_step(self.folder, table, step=rollouts.step, metadata=self.metadata)
        self.written.append(info.name)
        pruned: list[str] = []
        if self.retention.mode == "last" and len(self.written) > self.retention.n:
            pruned, self.written = self.written[: -self.retention.n], self.written[-self.retention.n :]
            rollout_files.remove(self.folder, pruned)
        self.seconds.append(time.perf_counter() - started)
        self.sink.emit("samples", info.event_data(pruned=pruned), step=rollouts.step)
