"""`posttrain track`: follow another engine's log files while its job writes them.

- verl's file logger (`trainer.logger=[file]`): JSON lines `{"step": N, "data": {name: value}}` at
  VERL_FILE_LOGGER_PATH, else `$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl` (verl/utils/tracking.py).
- TensorBoard event files (`events.out.tfevents.*`, any depth under a folder): OpenRLHF's
  `--use_tensorboard DIR`, verl's tensorboard logger (`TENSORBOARD_DIR`, else
  `tensorboard_log/<project>/<experiment>`), TRL's `report_to=tensorboard`. Read with TensorBoard's
  own loader, which resumes after a half-written record.

Each `poll()` returns what was completed since the last one, as (step, {posttrain name: value}).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posttrain_sdk.errors import PosttrainError
from posttrain_sdk.metric_names import tensorboard_name, verl_name

Points = list[tuple[int, dict[str, float]]]
TENSORBOARD_GLOB = "events.out.tfevents.*"


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None  # verl's orjson writes NaN as null; arrays and text are not metrics


def _grouped(records: list[tuple[int, str, float]], rename: Callable[[str], str]) -> Points:
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for step, key, value in records:
        by_step[step][rename(key)] = value
    return sorted(by_step.items())


class VerlJsonlFollower:
    format = "verl"
    engine = "verl"

    def __init__(self, path: Path):
        self.path = path
        self._offset = 0
        self._line = 0

    def poll(self) -> Points:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []  # the job has not created it yet
        end = data.rfind(b"\n")
        if end < 0:
            return []  # a line the writer has not finished
        records: list[tuple[int, str, float]] = []
        for raw in data[: end + 1].splitlines():
            self._line += 1
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
                step, values = int(entry["step"]), entry["data"]
            except (ValueError, KeyError, TypeError):
                raise PosttrainError(
                    f'{self.path} line {self._line}: not a verl file-logger line {{"step": N, "data": {{...}}}}'
                ) from None
            for key, value in values.items():
                number = _number(value)
                if number is not None:
                    records.append((step, key, number))
        self._offset += end + 1
        return _grouped(records, verl_name)


class TensorBoardFollower:
    format = "tensorboard"
    engine = "openrlhf"

    def __init__(self, path: Path):
        try:
            from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
            from tensorboard.util import tensor_util
        except ImportError:
            raise PosttrainError(
                "reading TensorBoard event files needs the tensorboard package: "
                "pip install 'posttrain-sdk[tensorboard]'"
            ) from None
        self._loader_class = LegacyEventFileLoader
        self._tensor_util = tensor_util
        self.path = path
        self._loaders: dict[Path, Any] = {}

    def _files(self) -> list[Path]:
        if self.path.is_file():
            return [self.path]
        return sorted(self.path.rglob(TENSORBOARD_GLOB)) if self.path.is_dir() else []

    def _value(self, value: Any) -> float | None:
        if value.HasField("simple_value"):
            return float(value.simple_value)
        if value.HasField("tensor"):
            array = self._tensor_util.make_ndarray(value.tensor)
            if array.size == 1 and array.dtype.kind in "fiub":
                return float(array.reshape(()))
        return None  # images, histograms, text

    def poll(self) -> Points:
        records: list[tuple[int, str, float]] = []
        for file in self._files():
            loader = self._loaders.get(file)
            if loader is None:
                loader = self._loaders[file] = self._loader_class(str(file))
            for event in loader.Load():
                if not event.HasField("summary"):
                    continue
                for value in event.summary.value:
                    number = self._value(value)
                    if number is not None:
                        records.append((int(event.step), value.tag, number))
        return _grouped(records, tensorboard_name)


def follower_for(path: Path, fmt: str = "auto") -> VerlJsonlFollower | TensorBoardFollower:
    """A follower for `path`: a verl JSONL file, or TensorBoard event files (a file or a folder, which
    the job may not have created yet)."""
    if fmt == "auto":
        if path.suffix in (".jsonl", ".json"):
            fmt = "verl"
        elif path.is_dir() or path.name.startswith("events.out.tfevents") or not (path.exists() or path.suffix):
            fmt = "tensorboard"
        else:
            raise PosttrainError(
                f"{path}: cannot tell the format (a .jsonl file is verl's, a folder holds TensorBoard event "
                "files); pass --format"
            )
    if fmt == "verl":
        return VerlJsonlFollower(path)
    if fmt == "tensorboard":
        return TensorBoardFollower(path)
    raise PosttrainError(f"--format: unknown format {fmt!r}")
