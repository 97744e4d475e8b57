"""Model FLOPs of a training step, for `throughput/train_mfu` (model FLOPs utilisation).

Per token of a sequence of s real tokens, forward: 2 FLOPs per weight of every matmul (each linear layer's
weight, the output head included, the input embedding lookup excluded), plus causal attention: token i
scores its i+1 keys and mixes their values, 2·d FLOPs each for QKᵀ and for AV per layer, d = heads ×
head_dim. Summed over the sequence that is 2·L·d·s(s+1) for attention. Backward costs twice the forward
for the input gradients and, for the weights that train, another 2 FLOPs per weight per token for the
weight gradients: with every weight trained that is the familiar 6·N per token plus 3× the attention
(Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, app. B, counts attention without the causal half).
Padding is not counted, nor is recomputation under gradient checkpointing (that is hardware FLOPs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ModelFlops:
    matmul_params: int  # weights of every matmul (linear layers, output head)
    trained_matmul_params: int  # those that get gradients (all of them, or LoRA's adapters alone)
    layers: int
    attention_width: int  # query heads × head dim

    def train_flops(self, lengths: torch.Tensor) -> float:
        """FLOPs of one forward and backward pass over sequences of `lengths` real tokens."""
        lengths = lengths.to(torch.float64)
        tokens = float(lengths.sum())
        attention_forward = 2.0 * self.layers * self.attention_width * float((lengths * (lengths + 1)).sum())
        weights = (4.0 * self.matmul_params + 2.0 * self.trained_matmul_params) * tokens
        return weights + 3.0 * attention_forward


def _numel(param: torch.Tensor) -> int:
    return int(getattr(param, "ds_numel", param.numel()))  # ZeRO-3 holds a placeholder


def model_flops(model: nn.Module) -> ModelFlops:
    """The FLOP counts of `model` (a Hugging Face causal LM, possibly wrapped by peft or DeepSpeed): every
    2-D weight outside an embedding table is a matmul's; layers and attention width from its config. A tied
    output head is counted once, as the matmul it is."""
    matmul = trained = 0
    seen: set[int] = set()
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or id(weight) in seen:
            continue
        dims = len(getattr(weight, "ds_shape", weight.shape))
        is_matmul = module is output or (not isinstance(module, nn.Embedding) and dims == 2)
        if not is_matmul:
            continue
        seen.add(id(weight))
        matmul += _numel(weight)
        trained += _numel(weight) if weight.requires_grad else 0
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return ModelFlops(matmul, trained, config.num_hidden_layers, heads * head_dim)


def mfu(flops: float, seconds: float, peak_flops_per_s: float) -> float:
    return flops / max(seconds, 1e-9) / peak_flops_per_s
