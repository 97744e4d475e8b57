"""Prompt datasets: JSONL, Parquet, CSV or a `datasets.save_to_disk` folder, turned into token ids.

Bad input gets an error that names the file, the line (or row) and the field. The prompt order is
seeded, and the position in it is part of the engine state, so a resumed run sees the same prompts
an uninterrupted run would have seen.
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_engine.config import DataConfig
from rl_engine.ledger import Draw


class DataError(ValueError):
    """A dataset problem, with the place it was found in the message."""


@dataclass(frozen=True)
class Prompt:
    text: str  # what the model sees (after the chat template, if any)
    raw: str  # the dataset's prompt field
    label: str | None
    token_ids: list[int]
    metadata: dict[str, Any] = field(default_factory=dict)


def _detect_format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    if path.is_dir():
        return "hf_disk"
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    formats = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".csv": "csv"}
    if suffix not in formats:
        raise DataError(f"{path}: cannot tell the format from the extension {suffix!r}; set data.format")
    return formats[suffix]


def read_rows(path: str | Path, fmt: str = "auto") -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    fmt = _detect_format(path, fmt)
    if fmt == "jsonl":
        return _read_jsonl(path)
    if fmt == "csv":
        with path.open(encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if fmt == "hf_disk":
        import datasets

        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            split = "train" if "train" in loaded else next(iter(loaded))
            loaded = loaded[split]
        return loaded.to_list()
    raise DataError(f"{path}: unknown format {fmt!r}")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """One JSON object a line; blank lines are skipped, and an error names the line."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}, line {number}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}, line {number}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def _row_fields(rows: list[dict[str, Any]], cfg: DataConfig, source: str) -> list[tuple[str, str | None, dict]]:
    out = []
    for number, row in enumerate(rows, start=1):
        prompt = row.get(cfg.prompt_field)
        if not isinstance(prompt, str) or not prompt:
            raise DataError(f"{source}, row {number}: field {cfg.prompt_field!r} is missing or not a non-empty string")
        label = None
        if cfg.label_field:
            if cfg.label_field not in row:
                raise DataError(f"{source}, row {number}: field {cfg.label_field!r} is missing")
            label = None if row[cfg.label_field] is None else str(row[cfg.label_field])
        metadata = {k: v for k, v in row.items() if k not in (cfg.prompt_field, cfg.label_field)}
        out.append((prompt, label, metadata))
    return out


def render_prompt(tokenizer: Any, text: str, cfg: DataConfig) -> str:
    if not cfg.apply_chat_template:
        return text
    messages = [{"role": "user", "content": text}]
    if cfg.system_prompt:
        messages.insert(0, {"role": "system", "content": cfg.system_prompt})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _to_prompts(items: list[tuple[str, str | None, dict]], tokenizer: Any, cfg: DataConfig) -> tuple[list[Prompt], int]:
    prompts, too_long = [], 0
    for raw, label, metadata in items:
        text = render_prompt(tokenizer, raw, cfg)
        ids = tokenizer(text, add_special_tokens=not cfg.apply_chat_template)["input_ids"]
        if len(ids) > cfg.max_prompt_tokens:
            too_long += 1  # dropped, not truncated: a cut prompt asks a different question
            continue
        prompts.append(Prompt(text=text, raw=raw, label=label, token_ids=list(ids), metadata=metadata))
    return prompts, too_long


@dataclass
class PromptData:
    train: list[Prompt]
    eval: list[Prompt]
    dropped_too_long: int

    @classmethod
    def load(cls, cfg: DataConfig, tokenizer: Any, seed: int) -> PromptData:
        items = _row_fields(read_rows(cfg.path, cfg.format), cfg, cfg.path)
        eval_items: list = []
        if cfg.eval_path:
            eval_items = _row_fields(read_rows(cfg.eval_path, cfg.format), cfg, cfg.eval_path)
        elif cfg.eval_fraction > 0:
            order = list(range(len(items)))
            random.Random(seed).shuffle(order)
            n_eval = max(1, int(len(items) * cfg.eval_fraction))
            held_out = set(order[:n_eval])
            eval_items = [items[i] for i in sorted(held_out)]
            items = [items[i] for i in range(len(items)) if i not in held_out]
        if cfg.eval_size is not None:
            eval_items = eval_items[: cfg.eval_size]
        train, dropped = _to_prompts(items, tokenizer, cfg)
        evaluation, dropped_eval = _to_prompts(eval_items, tokenizer, cfg)
        if not train:
            raise DataError(f"{cfg.path}: no usable prompts (all {dropped} exceed data.max_prompt_tokens)")
        return cls(train=train, eval=evaluation, dropped_too_long=dropped + dropped_eval)


class PromptSampler:
    """Walks the training prompts epoch by epoch in a seeded order; its position is resumable state."""

    def __init__(self, size: int, seed: int, shuffle: bool):
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.epoch, self.index = 0, 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def draw(self, n: int) -> list[Draw]:
        """The next `n` rows, each with its epoch (a batch can cross an epoch boundary)."""
        batch: list[Draw] = []
        while len(batch) < n:
            if self.index == self.size:
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
            take = min(n - len(batch), self.size - self.index)
            batch.extend(Draw(self.epoch, row) for row in self._order[self.index : self.index + take])
            self.index += take
        return batch

    def next_batch(self, n: int) -> list[int]:
        return [d.row for d in self.draw(n)]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._epoch_order(self.epoch)
