"""LoRA adapters (peft) on the policy: only the adapters train; the rollout engine and checkpoints get
the *merged* weights (W + alpha/r · B·A) under the base model's own Hugging Face names, so vLLM loads
them through its ordinary reload path and a checkpoint is a plain model folder (plus `adapter/` with
peft's files, to reuse the adapter alone).

Merging is computed into new tensors; the training model is never merged in place (a merge and
unmerge round trip would drift the base weights in low precision). The reference model stays the
plain base model.

QLoRA (a 4-bit base) needs CUDA and bitsandbytes: it is refused on hosts without a GPU, and not
available in this engine build on GPU hosts either (a merged sync from a 4-bit base needs its
dequantisation, which is not written yet).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from rl_engine.config import ConfigError, RunConfig

ADAPTER_DIR = "adapter"
_ADAPTER = "default"


def enabled(cfg: RunConfig) -> bool:
    return cfg.model.lora.enabled


def refuse_unavailable(cfg: RunConfig) -> None:
    """QLoRA asked for where it cannot run: a clear error naming the field, before anything loads."""
    lora = cfg.model.lora
    if not lora.enabled or lora.quantize_base == "none":
        return
    if not torch.cuda.is_available():
        message = "QLoRA (a 4-bit base) needs a CUDA GPU with bitsandbytes; this host has none — use quantize_base: none"
    else:
        message = "QLoRA (a 4-bit base) is not available in this engine build yet; use quantize_base: none"
    raise ConfigError([{"loc": "model.lora.quantize_base", "msg": message}])


def apply_lora(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """`model` wrapped with fresh adapters (B = 0: the policy starts equal to the base); base frozen."""
    from peft import LoraConfig, get_peft_model

    lora = cfg.model.lora
    targets: Any = "all-linear" if lora.target_modules == ["all-linear"] else list(lora.target_modules)
    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def load_adapter(model: nn.Module, checkpoint: Path) -> None:
    """Restores the adapter weights saved in a checkpoint's `adapter/` folder into `model`."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    file = Path(checkpoint) / ADAPTER_DIR / "adapter_model.safetensors"
    if not file.exists():
        raise FileNotFoundError(f"{checkpoint}: no LoRA adapter ({ADAPTER_DIR}/adapter_model.safetensors); "
                                "resume a LoRA run from one of its own checkpoints")
    result = set_peft_model_state_dict(model, load_file(str(file)))
    if result.unexpected_keys:
        raise ValueError(f"{file}: adapter tensors this model has no place for: {result.unexpected_keys[:3]}")


@torch.no_grad()
def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole policy with every adapter merged, under the base model's names. Layers without an
    adapter keep their own tensors, so tied weights still share storage."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {f"{name}.weight": module.get_delta_weight(_ADAPTER)
              for name, module in base.named_modules()
              if isinstance(module, LoraLayer) and _ADAPTER in module.lora_A}
    merged: dict[str, torch.Tensor] = {}
    for key, tensor in base.state_dict().items():
        if ".lora_" in key:
            continue
        name = key.replace(".base_layer.", ".")
        merged[name] = (tensor + deltas[name].to(tensor.dtype)) if name in deltas else tensor
    return merged


class MergedView:
    """What a weight sync reads (`state_dict()`): the merged weights of a LoRA policy."""

    def __init__(self, model: nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        return merged_state_dict(self.model)


def base_model(model: nn.Module) -> nn.Module:
    """The module whose `save_pretrained` writes a plain Hugging Face folder (its config, its names)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model
