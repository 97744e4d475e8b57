"""Reading a Hugging Face model folder without torch: config, weights, tokenizer, parameter count.

The parameter count comes from the safetensors headers (an 8-byte little-endian length, then a
JSON header giving each tensor's shape), so registering a 70B model reads a few kilobytes, not
the weights. Tied embeddings are stored once, so the count is what is stored. Folders with only
`pytorch_model*.bin` weights (pickles, unreadable without torch) get no count.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAFETENSORS_INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
# The safetensors format itself refuses headers above 100 MB; a bigger length is corruption.
MAX_HEADER_BYTES = 100 * 1024 * 1024


class ModelFolderError(ValueError):
    """A problem with a model folder; the message says what and where (the caller names the field)."""


@dataclass(frozen=True)
class ModelFolderInfo:
    path: Path
    architecture: str
    hf_config: dict[str, Any]
    parameter_count: int | None
    weight_files: list[str]


def inspect_model_folder(path: str | Path) -> ModelFolderInfo:
    """Check that `path` is a loadable HF model folder and read what the registry shows about it."""
    folder = Path(path).expanduser()
    if not str(path).strip():
        raise ModelFolderError("is required")
    if not folder.exists():
        raise ModelFolderError(f"{folder} does not exist")
    if not folder.is_dir():
        raise ModelFolderError(f"{folder} is not a folder (expected a Hugging Face model folder)")
    folder = folder.resolve()
    config = _read_config(folder)
    safetensors = sorted(folder.glob("*.safetensors"))
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if not safetensors and not bins and not (folder / SAFETENSORS_INDEX).exists():
        raise ModelFolderError(f"no weights in {folder} (expected *.safetensors or pytorch_model*.bin)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelFolderError(f"no tokenizer in {folder} (expected one of: {', '.join(TOKENIZER_FILES)})")
    shards = _safetensors_shards(folder, safetensors)
    count = safetensors_parameter_count(shards) if shards else None
    return ModelFolderInfo(
        path=folder,
        architecture=_architecture(config, folder),
        hf_config=config,
        parameter_count=count,
        weight_files=[p.name for p in (shards or bins)],
    )


def _read_config(folder: Path) -> dict[str, Any]:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelFolderError(f"no config.json in {folder}")
    try:
        # NaN/Infinity kept as text: the config is stored as JSON, and Postgres refuses them.
        config = json_safe(json.loads(config_file.read_text(encoding="utf-8"), parse_constant=str))
    except UnicodeDecodeError:
        raise ModelFolderError(f"config.json in {folder} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:  # its message names a line and column, never the text
        raise ModelFolderError(f"config.json in {folder} is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ModelFolderError(f"config.json in {folder} must hold a JSON object")
    return config


def json_safe(value: Any) -> Any:
    """`value` as Postgres stores it in jsonb, which refuses NUL characters in strings (replaced here)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def _architecture(config: dict[str, Any], folder: Path) -> str:
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ModelFolderError(f"config.json in {folder}: 'architectures' must be a list of class names")
    return architectures[0] if architectures else ""


def _safetensors_shards(folder: Path, found: list[Path]) -> list[Path]:
    """The files holding the weights: the shards an index lists, else every *.safetensors file."""
    index_file = folder / SAFETENSORS_INDEX
    if not index_file.is_file():
        return found
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
        weight_map = index["weight_map"]
        names = sorted(set(weight_map.values()))
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        # The type only: a message could quote the file, which may not be the user's own.
        raise ModelFolderError(
            f"{SAFETENSORS_INDEX} in {folder} is not a valid index (a JSON object with a weight_map: "
            f"{type(exc).__name__})"
        ) from None
    shards = [folder / str(name) for name in names]
    missing = [shard for shard in shards if not shard.is_file() or shard.parent != folder]
    if missing:
        raise ModelFolderError(
            f"{len(missing)} of the {len(shards)} shards {SAFETENSORS_INDEX} lists are missing from {folder}"
        )
    return shards


def read_safetensors_header(file: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: tensor name -> {dtype, shape, data_offsets}."""
    try:
        with file.open("rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise ModelFolderError(f"{file.name} is not a safetensors file (too short)")
            (length,) = struct.unpack("<Q", prefix)
            size = file.stat().st_size
            if length > MAX_HEADER_BYTES or length > size - 8:
                raise ModelFolderError(
                    f"{file.name} has a corrupt safetensors header (header length {length}, file size {size})"
                )
            raw = f.read(length)
    except OSError as exc:
        raise ModelFolderError(f"cannot read {file.name}: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw)
    except UnicodeDecodeError:
        raise ModelFolderError(f"{file.name} has a corrupt safetensors header (not UTF-8)") from None
    except json.JSONDecodeError as exc:  # its message names a position, never the text
        raise ModelFolderError(f"{file.name} has a corrupt safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise ModelFolderError(f"{file.name} has a corrupt safetensors header (not a JSON object)")
    return header


def safetensors_parameter_count(files: list[Path]) -> int:
    """Sum over every stored tensor of the product of its shape."""
    total = 0
    for file in files:
        for name, entry in read_safetensors_header(file).items():
            if name == "__metadata__":
                continue
            shape = entry.get("shape") if isinstance(entry, dict) else None
            if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
                # Not by name: the header is the file's content, which may not be the user's own.
                raise ModelFolderError(f"{file.name}: a tensor has no valid shape in the header")
            total += math.prod(shape)  # a scalar (shape []) is one parameter
    return total
