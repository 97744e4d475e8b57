"""Checkpoints: `runs/<id>/checkpoints/step_<n>/` holds the policy in Hugging Face format (loads in plain
transformers and vLLM) plus `engine_state.pt` (optimizer, scheduler, step, data position, RNG, the prompt
ledger, and in async mode the batches generated ahead)."""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rl_engine.spec.checkpoints import ENGINE_STATE, checkpoint_dir, list_checkpoints


@dataclass(frozen=True)
class EngineState:
    step: int
    trainer: dict[str, Any]
    sampler: dict[str, int]
    rng: dict[str, Any]
    metrics_so_far: dict[str, float]  # cumulative counters (samples, tokens, elapsed) carried over
    # Async mode: the batches generated ahead of the step, finished, for the steps after it
    # (`loop.PendingRollout.saved`), so that a resumed run drops none. Empty in sync mode.
    pending: list[dict[str, Any]] = field(default_factory=list)
    # The prompt ledger (`rl_engine.ledger.PromptLedger.state_dict`); None in checkpoints from before it.
    ledger: dict[str, Any] | None = None


def capture_rng() -> dict[str, Any]:
    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    tokenizer: Any,
    state: EngineState,
    keep_last: int,
    weights: dict[str, torch.Tensor] | None = None,
    adapter: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Writes into a temporary folder and renames it, so a crash never leaves a half checkpoint that
    `latest_checkpoint` would pick up. `weights`: the model's whole state dict when its parameters do
    not hold it (DeepSpeed ZeRO-3; LoRA, merged); default `model.state_dict()`. A LoRA policy (a peft
    model) is written as its base model's plain folder with the merged weights, plus `adapter/`
    (peft's files; `adapter`: its tensors when the parameters do not hold them whole, under ZeRO-3)."""
    from rl_engine.lora import ADAPTER_DIR, base_model, save_adapter

    final = checkpoint_dir(run_dir, step)
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    base_model(model).save_pretrained(partial, state_dict=weights, safe_serialization=True)
    if hasattr(model, "peft_config"):
        save_adapter(model, partial / ADAPTER_DIR, adapter)
    tokenizer.save_pretrained(partial)
    torch.save(state.__dict__, partial / ENGINE_STATE)
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    for old in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old)
    return final


def load_engine_state(path: Path) -> EngineState:
    file = Path(path) / ENGINE_STATE
    if not file.exists():
        raise FileNotFoundError(f"{path}: not a checkpoint folder (no {ENGINE_STATE})")
    # weights_only=False: the state holds Python RNG tuples; the file is our own, never user input.
    return EngineState(**torch.load(file, weights_only=False))
