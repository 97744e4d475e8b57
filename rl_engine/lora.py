"""LoRA adapters (peft) on the policy: only the adapters train; the rollout engine and checkpoints get
the *merged* weights (W + alpha/r · B·A) under the base model's own Hugging Face names, so vLLM loads
them through its ordinary reload path and a checkpoint is a plain model folder (plus `adapter/` with
peft's files, to reuse the adapter alone).

Merging is computed into new tensors; the training model is never merged in place (a merge and
unmerge round trip would drift the base weights in low precision). The reference model stays the
plain base model.

QLoRA (`quantize_base: 4bit`, a bitsandbytes 4-bit base) is refused on hosts without CUDA. Its CUDA
path (`load_quantized_base`, and the dequantising branch of `merged_state_dict`) is written but has
never run: no host here has a GPU or bitsandbytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from rl_engine.config import ConfigError, RunConfig
from rl_engine.devices import DTYPES, policy_dtype

ADAPTER_DIR = "adapter"
_ADAPTER = "default"


def enabled(cfg: RunConfig) -> bool:
    return cfg.model.lora.enabled


def refuse_qlora_without_cuda(cfg: RunConfig, device: torch.device | None = None) -> None:
    """QLoRA asked for where it cannot run (no CUDA here, or a policy placed on the CPU): a clear error
    naming the field, before anything loads."""
    lora = cfg.model.lora
    on_cuda = torch.cuda.is_available() if device is None else device.type == "cuda"
    if lora.enabled and lora.quantize_base == "4bit" and not on_cuda:
        raise ConfigError(
            [
                {
                    "loc": "model.lora.quantize_base",
                    "msg": "QLoRA (4-bit base) needs a CUDA GPU with bitsandbytes for the policy "
                    "(placement.device, gpus_per_trainer) — or use quantize_base: none",
                }
            ]
        )


def load_quantized_base(path: str | Path, cfg: RunConfig) -> nn.Module:
    """The frozen base in 4-bit NF4 on the current CUDA device, prepared for k-bit training (norms in
    fp32, input gradients on for gradient checkpointing). Untested: needs CUDA and bitsandbytes."""
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    dtype = DTYPES[policy_dtype(cfg)]
    quantization = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
    )
    model = AutoModelForCausalLM.from_pretrained(
        str(path),
        dtype=dtype,
        quantization_config=quantization,
        device_map={"": torch.cuda.current_device()},
        trust_remote_code=cfg.model.trust_remote_code,
    )
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.model.gradient_checkpointing)


def apply_lora(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """`model` wrapped with fresh adapters (B = 0: the policy starts equal to the base); base frozen."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer

    lora = cfg.model.lora
    tied = _tied_embedding_names(model)
    targets: Any = "all-linear" if lora.target_modules == ["all-linear"] else list(lora.target_modules)
    config = LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets, task_type="CAUSAL_LM"
    )
    model = get_peft_model(model, config)
    # A merged tied head would no longer equal the embedding, yet checkpoints and vLLM store only one.
    adapted_tied = [
        name
        for name, module in model.get_base_model().named_modules()
        if name in tied and isinstance(module, LoraLayer)
    ]
    if adapted_tied:
        raise ConfigError(
            [
                {
                    "loc": "model.lora.target_modules",
                    "msg": f"{', '.join(adapted_tied)} share tied weights (tie_word_embeddings); "
                    "an adapter on them cannot be merged: leave them out of target_modules",
                }
            ]
        )
    return model


def _tied_embedding_names(model: nn.Module) -> set[str]:
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    if outputs is None or inputs is None or outputs.weight is not inputs.weight:
        return set()
    return {name for name, module in model.named_modules() if module is inputs or module is outputs}


def load_adapter(model: nn.Module, checkpoint: Path) -> None:
    """Restores the adapter weights saved in a checkpoint's `adapter/` folder into `model`."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    file = Path(checkpoint) / ADAPTER_DIR / "adapter_model.safetensors"
    if not file.exists():
        raise FileNotFoundError(
            f"{checkpoint}: no LoRA adapter ({ADAPTER_DIR}/adapter_model.safetensors); "
            "resume a LoRA run from one of its own checkpoints"
        )
    result = set_peft_model_state_dict(model, load_file(str(file)))
    if result.unexpected_keys:
        raise ValueError(f"{file}: adapter tensors this model has no place for: {result.unexpected_keys[:3]}")


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's own tensors under the peft model's names (what `save_adapter` takes)."""
    return {name: tensor for name, tensor in model.state_dict().items() if ".lora_" in name}


def save_adapter(model: nn.Module, folder: Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """peft's adapter folder (adapter_config.json, adapter_model.safetensors) in `folder`; `state`: the
    adapter tensors when the model's parameters do not hold them whole (ZeRO-3: gathered copies)."""
    model.save_pretrained(str(folder), state_dict=state if state is not None else adapter_state_dict(model))


@torch.no_grad()
def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole policy with every adapter merged, under the base model's names. Layers without an
    adapter keep their own tensors, so tied weights still share storage. Under ZeRO-3, call it
    inside the gather (`trainer.full_weights()`)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {
        f"{name}.weight": module.get_delta_weight(_ADAPTER)
        for name, module in base.named_modules()
        if isinstance(module, LoraLayer) and _ADAPTER in module.lora_A
    }
    quantized = _dequantized_weights(base)
    merged: dict[str, torch.Tensor] = {}
    for key, tensor in base.state_dict().items():
        if ".lora_" in key or any(key.startswith(f"{q}.") for q in quantized):
            continue  # adapters, and bitsandbytes' quantisation state of a 4-bit weight
        tensor = quantized.get(key, tensor)
        name = key.replace(".base_layer.", ".")
        merged[name] = (tensor + deltas[name].to(tensor.dtype)) if name in deltas else tensor
    return merged


def _dequantized_weights(base: nn.Module) -> dict[str, torch.Tensor]:
    """QLoRA: every 4-bit weight dequantised (vLLM and checkpoints take plain weights). Untested here."""
    found = {
        f"{name}.weight": module
        for name, module in base.named_modules()
        if type(getattr(module, "weight", None)).__name__ == "Params4bit"
    }
    if not found:
        return {}
    from peft.utils.integrations import dequantize_module_weight

    return {key: dequantize_module_weight(module) for key, module in found.items()}


class MergedView:
    """What a weight sync reads (`state_dict()`): the merged weights of a LoRA policy."""

    def __init__(self, model: nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        return merged_state_dict(self.model)


def base_model(model: nn.Module) -> nn.Module:
    """The module whose `save_pretrained` writes a plain Hugging Face folder (its config, its names)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model
