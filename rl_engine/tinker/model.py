"""One Tinker training client's model: a base causal LM with a LoRA adapter and its Adam state.

Everything the service computes goes through here: ``forward_backward`` (a batch of datums, a named
loss from :mod:`rl_engine.tinker.losses`, gradients accumulated until ``optim_step``), ``forward``,
``optim_step`` with the SDK's ``AdamParams``, ``sample`` from the adapter saved for sampling, and the
adapter saved and loaded with or without its optimizer state. No HTTP and no Django: plain tensors in,
plain values out, so the numbers can be checked against the engine's own functions.

The log-probs are the engine's (:func:`rl_engine.trainer.token_logprobs`: ``log_softmax`` of fp32
logits), so a datum's loss and log-probs equal what the engine computes for the same tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rl_engine.tinker.losses import LOSS_REQUIREMENTS, LossRefused, check_loss_name, datum_loss
from rl_engine.trainer import token_logprobs

__all__ = ["AdamSettings", "Datum", "LoraSettings", "SampleSettings", "SampledText", "TinkerModel"]

#: Tinker's LoRA scale: alpha is fixed, so the learning rate, not the rank, sets the step size.
LORA_ALPHA = 32
OPTIMIZER_FILE = "optimizer.pt"
META_FILE = "tinker_meta.json"
_ATTENTION_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP_NAMES = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSettings:
    rank: int
    seed: int | None = None
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True


@dataclass(frozen=True)
class AdamSettings:
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclass(frozen=True)
class Datum:
    tokens: list[int]
    inputs: dict[str, Tensor]  # 1-D, each as long as `tokens`


@dataclass(frozen=True)
class SampleSettings:
    max_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()


@dataclass
class SampledText:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" or "length"


@dataclass
class ForwardResult:
    loss: float
    logprobs: list[list[float]]
    tokens: int
    metrics: dict[str, float] = field(default_factory=dict)


def lora_targets(model: nn.Module, lora: LoraSettings) -> list[str]:
    """The linear modules the adapter wraps, by the three switches Tinker's ``LoraConfig`` has. A head tied to
    the embedding is left out (an adapter there could not be merged into the one stored matrix)."""
    names: list[str] = []
    tied = model.get_output_embeddings() is not None and (
        model.get_output_embeddings().weight is model.get_input_embeddings().weight
    )
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        leaf = name.rsplit(".", 1)[-1]
        wanted = (
            (lora.train_attn and leaf in _ATTENTION_NAMES)
            or (lora.train_mlp and leaf in _MLP_NAMES)
            or (lora.train_unembed and leaf == "lm_head" and not tied)
        )
        if wanted:
            names.append(leaf)
    if not names:
        raise LossRefused("lora_config: no module to adapt (train_attn, train_mlp and train_unembed all off)")
    return sorted(set(names))


class TinkerModel:
    """A base model from a local folder with a fresh LoRA adapter (B = 0, so it starts equal to the base)."""

    def __init__(self, path: str | Path, lora: LoraSettings, dtype: torch.dtype = torch.float32) -> None:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = Path(path)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.path))
        base = AutoModelForCausalLM.from_pretrained(str(self.path), dtype=dtype)
        if lora.rank < 1:
            raise LossRefused(f"lora_config.rank must be >= 1, got {lora.rank}")
        config = LoraConfig(
            r=lora.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=lora_targets(base, lora)
        )
        if lora.seed is not None:
            torch.manual_seed(lora.seed)
        self.model = get_peft_model(base, config)
        self.model.eval()  # no dropout: a forward is a function of the weights alone
        self.lora = lora
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.trainable, lr=0.0)
        self.steps = 0
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.max_length = int(getattr(base.config, "max_position_embeddings", 2048))

    # --- forward and backward --------------------------------------------------------------------------

    def check(self, data: Sequence[Datum], loss_fn: str) -> None:
        """Every datum well formed for ``loss_fn``, before any compute: a bad one names its index and field."""
        check_loss_name(loss_fn)
        if not data:
            raise LossRefused("data: at least one datum is required")
        for index, datum in enumerate(data):
            _check_datum(index, datum, LOSS_REQUIREMENTS[loss_fn], self.vocab_size, self.max_length)

    def forward_backward(
        self,
        data: Sequence[Datum],
        loss_fn: str,
        config: Mapping[str, float | str] | None = None,
        backward: bool = True,
    ) -> ForwardResult:
        self.check(data, loss_fn)
        with torch.set_grad_enabled(backward):
            target_logprobs = self._target_logprobs(data)
            losses = [datum_loss(loss_fn, lp, d.inputs, config) for lp, d in zip(target_logprobs, data, strict=True)]
            total = torch.stack(losses).sum()
            if backward:
                total.backward()
        return ForwardResult(
            loss=float(total.detach()),
            logprobs=[lp.detach().tolist() for lp in target_logprobs],
            tokens=sum(len(d.tokens) for d in data),
        )

    def _target_logprobs(self, data: Sequence[Datum]) -> list[Tensor]:
        width = max(len(d.tokens) for d in data)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(data), width), pad, dtype=torch.long)
        mask = torch.zeros((len(data), width), dtype=torch.long)
        targets = torch.zeros((len(data), width), dtype=torch.long)
        for row, datum in enumerate(data):
            n = len(datum.tokens)
            ids[row, :n] = torch.tensor(datum.tokens)
            mask[row, :n] = 1
            targets[row, :n] = datum.inputs["target_tokens"].long()
        logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        logprobs = token_logprobs(logits, targets)
        return [logprobs[row, : len(d.tokens)] for row, d in enumerate(data)]

    # --- the optimizer -----------------------------------------------------------------------------------

    def optim_step(self, adam: AdamSettings) -> dict[str, float]:
        """One AdamW step with this call's hyper-parameters on the accumulated gradients, which it then clears."""
        if adam.learning_rate < 0:
            raise LossRefused(f"adam_params.learning_rate must be >= 0, got {adam.learning_rate}")
        for group in self.optimizer.param_groups:
            group.update(
                lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps, weight_decay=adam.weight_decay
            )
        grads = [p.grad for p in self.trainable if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0
        if adam.grad_clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.trainable, adam.grad_clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm": norm, "learning_rate": adam.learning_rate}

    # --- weights -----------------------------------------------------------------------------------------

    def adapter_state(self) -> dict[str, Tensor]:
        return {name: p.detach().clone() for name, p in self.model.named_parameters() if p.requires_grad}

    def save(self, folder: Path, with_optimizer: bool) -> None:
        """peft's adapter folder (what vLLM and transformers load), plus Adam's state for a full save."""
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(folder))
        if with_optimizer:
            torch.save({"optimizer": self.optimizer.state_dict(), "steps": self.steps}, folder / OPTIMIZER_FILE)
        (folder / META_FILE).write_text(json.dumps({"base_model": str(self.path), "rank": self.lora.rank}))

    def load(self, folder: Path, with_optimizer: bool) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        weights = folder / "adapter_model.safetensors"
        if not weights.exists():
            raise LossRefused(f"{folder.name}: no adapter weights saved there")
        result = set_peft_model_state_dict(self.model, load_file(str(weights)))
        if result.unexpected_keys:
            raise LossRefused(
                f"{folder.name}: the checkpoint's adapter does not fit this model (rank or modules differ)"
            )
        if with_optimizer:
            saved = folder / OPTIMIZER_FILE
            if not saved.exists():
                raise LossRefused(f"{folder.name}: saved for sampling, without optimizer state")
            state = torch.load(saved, weights_only=True)
            self.optimizer.load_state_dict(state["optimizer"])
            self.steps = int(state["steps"])

    # --- sampling ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def sample(
        self, prompt: list[int], settings: SampleSettings, num_samples: int, adapter: Mapping[str, Tensor] | None
    ) -> list[SampledText]:
        """``num_samples`` continuations of ``prompt`` under ``adapter`` (weights saved for sampling; None: the
        base model). Each token's log-prob is the temperature-scaled distribution's, from a forward pass over
        the whole sequence, so it equals what ``forward`` computes for the same tokens at temperature 1."""
        _check_tokens("prompt", prompt, self.vocab_size)
        with self._weights(adapter):
            return [self._sample_one(prompt, settings, i) for i in range(num_samples)]

    def _sample_one(self, prompt: list[int], settings: SampleSettings, index: int) -> SampledText:
        from transformers import GenerationConfig

        generator_seed = None if settings.seed is None else settings.seed + index
        if generator_seed is not None:
            torch.manual_seed(generator_seed)
        greedy = settings.temperature == 0
        config = GenerationConfig(
            max_new_tokens=settings.max_tokens,
            do_sample=not greedy,
            temperature=None if greedy else settings.temperature,
            top_k=None if settings.top_k < 0 else settings.top_k,
            top_p=None if greedy else settings.top_p,
            eos_token_id=list(settings.stop_token_ids) or None,
            pad_token_id=self.tokenizer.pad_token_id or 0,
            stop_strings=list(settings.stop_strings) or None,
        )
        ids = torch.tensor([prompt])
        out = self.model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config, tokenizer=self.tokenizer
        )
        new = out[0, len(prompt) :].tolist()
        new = _trim_after_stop(new, settings, self.tokenizer)
        stopped = len(new) < settings.max_tokens or _ends_with_stop(new, settings, self.tokenizer)
        logprobs = self._sequence_logprobs(prompt, new, settings.temperature) if new else []
        return SampledText(tokens=new, logprobs=logprobs, stop_reason="stop" if stopped else "length")

    def _sequence_logprobs(self, prompt: list[int], new: list[int], temperature: float) -> list[float]:
        ids = torch.tensor([prompt + new])
        logits = self.model(input_ids=ids, use_cache=False).logits.float()[0, len(prompt) - 1 : -1]
        scale = temperature if temperature > 0 else 1.0
        return token_logprobs(logits / scale, torch.tensor(new)).tolist()

    @torch.no_grad()
    def prompt_logprobs(self, prompt: list[int], adapter: Mapping[str, Tensor] | None) -> list[float | None]:
        with self._weights(adapter):
            ids = torch.tensor([prompt])
            logits = self.model(input_ids=ids, use_cache=False).logits.float()[0, :-1]
            scores = token_logprobs(logits, ids[0, 1:]).tolist()
        return [None, *scores]

    def _weights(self, adapter: Mapping[str, Tensor] | None) -> _SwappedWeights:
        return _SwappedWeights(self, adapter)


class _SwappedWeights:
    """The adapter's parameters set to a saved state for the block (or the adapter disabled: the base model),
    then the trained ones put back: one copy of the model serves training and sampling."""

    def __init__(self, owner: TinkerModel, adapter: Mapping[str, Tensor] | None) -> None:
        self.owner, self.adapter = owner, adapter
        self.kept: dict[str, Tensor] = {}
        self.disabled: Any = None

    def __enter__(self) -> None:
        if self.adapter is None:
            self.disabled = self.owner.model.disable_adapter()
            self.disabled.__enter__()
            return
        params = dict(self.owner.model.named_parameters())
        for name, value in self.adapter.items():
            self.kept[name] = params[name].detach().clone()
            params[name].data.copy_(value)

    def __exit__(self, *exc: object) -> None:
        if self.disabled is not None:
            self.disabled.__exit__(*exc)
            return
        params = dict(self.owner.model.named_parameters())
        for name, value in self.kept.items():
            params[name].data.copy_(value)


def _check_tokens(field_name: str, tokens: Sequence[int], vocab_size: int) -> None:
    if not tokens:
        raise LossRefused(f"{field_name}: no tokens")
    bad = next((t for t in tokens if not 0 <= int(t) < vocab_size), None)
    if bad is not None:
        raise LossRefused(f"{field_name}: token id {bad} is outside the vocabulary (size {vocab_size})")


def _check_datum(index: int, datum: Datum, required: tuple[str, ...], vocab_size: int, max_length: int) -> None:
    where = f"data[{index}]"
    _check_tokens(f"{where}.model_input", datum.tokens, vocab_size)
    if len(datum.tokens) > max_length:
        raise LossRefused(f"{where}.model_input: {len(datum.tokens)} tokens, over the model's {max_length}")
    for name in ("target_tokens", *required):
        if name not in datum.inputs:
            raise LossRefused(f"{where}.loss_fn_inputs: {name!r} is required")
    for name, tensor in datum.inputs.items():
        if tensor.dim() != 1 or tensor.shape[0] != len(datum.tokens):
            raise LossRefused(
                f"{where}.loss_fn_inputs[{name!r}]: shape {list(tensor.shape)}, "
                f"but model_input has {len(datum.tokens)} tokens (they must agree)"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise LossRefused(f"{where}.loss_fn_inputs[{name!r}]: not every value is finite")
    _check_tokens(f"{where}.loss_fn_inputs['target_tokens']", datum.inputs["target_tokens"].tolist(), vocab_size)


def _stop_ids(settings: SampleSettings) -> set[int]:
    return set(settings.stop_token_ids)


def _ends_with_stop(tokens: list[int], settings: SampleSettings, tokenizer: Any) -> bool:
    if tokens and tokens[-1] in _stop_ids(settings):
        return True
    text = tokenizer.decode(tokens)
    return any(text.endswith(s) for s in settings.stop_strings)


def _trim_after_stop(tokens: list[int], settings: SampleSettings, tokenizer: Any) -> list[int]:
    """Up to and including the first stop (generate pads finished rows, and a stop string can end mid-batch)."""
    stops = _stop_ids(settings)
    for i, token in enumerate(tokens):
        if token in stops:
            return tokens[: i + 1]
    if settings.stop_strings:
        for end in range(1, len(tokens) + 1):
            if any(tokenizer.decode(tokens[:end]).endswith(s) for s in settings.stop_strings):
                return tokens[:end]
    return tokens
