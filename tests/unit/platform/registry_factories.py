"""Registry rows made straight through the ORM, for tests that need an object but not the
validation path (permission matrix, delete-in-use); the services are tested on their own."""

from __future__ import annotations

import json
import struct
import uuid
from pathlib import Path
from typing import Any


def a_model_row(name: str | None = None, path: str = "/nonexistent/model") -> Any:
    from posttrain.registry.models import ModelAsset

    return ModelAsset.objects.create(name=name or f"model-{uuid.uuid4().hex[:8]}", path=path)


def a_dataset_row(name: str = "data") -> Any:
    from posttrain.registry.models import Dataset

    return Dataset.objects.create(
        name=name,
        sha256=uuid.uuid4().hex * 2,
        format="jsonl",
        path="/nonexistent/data.jsonl",
        size_bytes=1,
        row_count=1,
    )


def a_reward_row(name: str | None = None) -> Any:
    from posttrain.registry.models import RewardFunction

    return RewardFunction.objects.create(
        name=name or f"reward-{uuid.uuid4().hex[:8]}",
        kind="builtin",
        spec={"type": "exact_match", "name": "exact_match"},
    )


def an_experiment(model: Any = None, dataset: Any = None, rewards: list[Any] = (), name: str = "exp") -> Any:
    from posttrain.runs.models import Experiment, ExperimentReward

    experiment = Experiment.objects.create(
        name=name, model=model or a_model_row(), dataset=dataset or a_dataset_row(), config={}
    )
    for position, reward in enumerate(rewards):
        ExperimentReward.objects.create(experiment=experiment, reward=reward, position=position)
    return experiment


def write_safetensors(path: Path, shapes: dict[str, list[int]], metadata: dict[str, str] | None = None) -> None:
    """A valid float32 safetensors file with the given tensor shapes (zeros), written by hand."""
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in shapes.items():
        size = 4
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    if metadata is not None:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def write_model_folder(
    folder: Path, shapes: dict[str, list[int]] | None = None, *, architecture: str = "LlamaForCausalLM"
) -> Path:
    """A small model folder with config.json, one safetensors file and a tokenizer file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [architecture], "model_type": "llama"}))
    (folder / "tokenizer.json").write_text("{}")
    write_safetensors(folder / "model.safetensors", shapes or {"w": [2, 3]})
    return folder
