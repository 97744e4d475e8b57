"""Policy (and critic) training on one process with a torch optimizer — the simplest real backend.

The DeepSpeed backend (`rl_engine.backends.deepspeed_trainer`) plugs in behind the same calls:
`forward` (log-probs, values), `update` (one RL step's optimisation over an `Experience`),
`state_dict`/`load_state_dict`, and `full_state_dict`/`full_weights` (the whole policy, for weight
sync and checkpoints). It reuses this class's update logic and replaces only the four hooks below
"the hooks a backend replaces": where forward passes run, how losses go backward, zeroing, the step.
"""

from __future__ import annotations

import math
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rl_engine.algorithms import aggregate, entropy_from_logits, kl_estimate, masked_mean, policy_loss, value_loss
from rl_engine.config import RunConfig
from rl_engine.devices import peak_flops, precision_for
from rl_engine.flops import mfu, model_flops


@dataclass
class TokenBatch:
    """Left-padded prompts followed by right-padded responses: `sequences[:, :P]` are prompts,
    `sequences[:, P:]` responses; `response_mask` marks the real response tokens."""

    sequences: torch.Tensor  # [B, P + T]
    attention_mask: torch.Tensor  # [B, P + T]
    position_ids: torch.Tensor  # [B, P + T]
    response_mask: torch.Tensor  # [B, T] float
    prompt_width: int  # P

    @classmethod
    def build(
        cls,
        prompts: list[list[int]],
        responses: list[list[int]],
        pad_id: int,
        action_masks: list[tuple[int, ...] | None] | None = None,
    ) -> TokenBatch:
        """`action_masks`: per response, 1 for the policy's tokens and 0 for observations inserted by an
        environment (None = every token is an action); observations stay in the sequence as context
        but out of `response_mask`, so no loss term sees them."""
        p_width = max(len(p) for p in prompts)
        t_width = max(1, max(len(r) for r in responses))
        batch = len(prompts)
        sequences = torch.full((batch, p_width + t_width), pad_id, dtype=torch.long)
        attention = torch.zeros((batch, p_width + t_width), dtype=torch.long)
        for row, (prompt, response) in enumerate(zip(prompts, responses)):
            sequences[row, p_width - len(prompt) : p_width] = torch.tensor(prompt, dtype=torch.long)
            attention[row, p_width - len(prompt) : p_width] = 1
            if response:
                sequences[row, p_width : p_width + len(response)] = torch.tensor(response, dtype=torch.long)
                attention[row, p_width : p_width + len(response)] = 1
        positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
        response_mask = attention[:, p_width:].float()
        for row, mask in enumerate(action_masks or []):
            if mask is not None:
                response_mask[row, : len(mask)] *= torch.tensor(mask, dtype=torch.float32)
        return cls(sequences, attention, positions, response_mask, p_width)

    def __len__(self) -> int:
        return self.sequences.shape[0]

    def select(self, index: torch.Tensor | slice) -> TokenBatch:
        return TokenBatch(
            self.sequences[index],
            self.attention_mask[index],
            self.position_ids[index],
            self.response_mask[index],
            self.prompt_width,
        )

    def to(self, device: torch.device) -> TokenBatch:
        move = lambda t: t.to(device, non_blocking=True)  # noqa: E731
        return TokenBatch(
            move(self.sequences),
            move(self.attention_mask),
            move(self.position_ids),
            move(self.response_mask),
            self.prompt_width,
        )


@dataclass
class Experience:
    """Everything one RL step's update needs; one record drives both the update and the logging."""

    batch: TokenBatch
    advantages: torch.Tensor  # [B, T]
    # [B, T] the ratio's denominator: the trainer's before the update (proximal) or the rollout engine's
    # (behaviour; `algorithm.ratio_against`); None = on-policy single update (ratio is 1)
    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None  # [B, T] when the KL is a loss term
    old_values: torch.Tensor | None = None  # [B, T] (PPO)
    returns: torch.Tensor | None = None  # [B, T] (PPO)
    # [B, T]: the rollout engine's log-probs of the sampled tokens, compared with the training forward's
    # (`rollout/logprob_diff_*`) when that forward sees the weights the engine sampled from.
    rollout_logprobs: torch.Tensor | None = None
    # [B, T]: the rollout correction's per-token weights on the policy loss (None = no correction).
    correction_weights: torch.Tensor | None = None
    # [B, T]: the behaviour policy's log-probs, for a loss that weighs by pi_proximal / pi_behaviour itself
    # (decoupled PPO) when no correction gives that weight.
    behaviour_logprobs: torch.Tensor | None = None

    def select(self, index: torch.Tensor) -> Experience:
        return self._map(self.batch.select(index), lambda t: t[index])

    def to(self, device: torch.device) -> Experience:
        """This record on `device`: one host-to-device copy per tensor (the trainer moves each micro-batch once)."""
        return self._map(self.batch.to(device), lambda t: t.to(device, non_blocking=True))

    def _map(self, batch: TokenBatch, change: Any) -> Experience:
        apply = lambda t: None if t is None else change(t)  # noqa: E731
        return Experience(
            batch,
            change(self.advantages),
            apply(self.old_logprobs),
            apply(self.ref_logprobs),
            apply(self.old_values),
            apply(self.returns),
            apply(self.rollout_logprobs),
            apply(self.correction_weights),
            apply(self.behaviour_logprobs),
        )


class ValueModel(nn.Module):
    """PPO critic: the policy's transformer body with a scalar head, initialised from the policy."""

    def __init__(self, body: nn.Module, hidden_size: int):
        super().__init__()
        self.body = body
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        dtype: torch.dtype,
        trust_remote_code: bool = False,
        *,
        device: torch.device | None = None,
        gradient_checkpointing: bool = False,
    ) -> ValueModel:
        from transformers import AutoModel

        body = AutoModel.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
        if gradient_checkpointing:
            body.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return cls(body, body.config.hidden_size).to(device=device, dtype=dtype)

    @property
    def config(self) -> Any:
        return self.body.config

    def forward(self, batch: TokenBatch) -> torch.Tensor:
        hidden = self.body(
            input_ids=batch.sequences, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).last_hidden_state
        # The value of the state before response token t is read where the token is predicted.
        p = batch.prompt_width
        return self.value_head(hidden[:, p - 1 : -1]).squeeze(-1).float()


def response_logits(model: nn.Module, batch: TokenBatch, temperature: float) -> torch.Tensor:
    """Logits `[B, T, V]` that predict each response token, scaled by the sampling temperature so the
    log-probs are those of the distribution the tokens were drawn from."""
    p = batch.prompt_width
    logits = model(
        input_ids=batch.sequences, attention_mask=batch.attention_mask, position_ids=batch.position_ids, use_cache=False
    ).logits[:, p - 1 : -1]
    logits = logits.float()
    return logits / temperature if temperature != 1.0 else logits


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def module_device(model: nn.Module) -> torch.device:
    """Where `model`'s weights are (a DeepSpeed engine's, ZeRO-3 placeholders included)."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(model.parameters()).device


@torch.no_grad()
def batched_logprobs(
    model: nn.Module, batch: TokenBatch, micro: int, temperature: float, device: torch.device | None = None
) -> torch.Tensor:
    """Log-probs `[B, T]` of `batch`'s response tokens under `model`, `micro` rows at a time, each moved to
    `device` (default: the model's); returned on the CPU, where the loop's batch lives, in one copy."""
    device = device or module_device(model)
    outputs = []
    for start in range(0, len(batch), micro):
        part = batch.select(slice(start, start + micro)).to(device)
        outputs.append(
            token_logprobs(response_logits(model, part, temperature), part.sequences[:, part.prompt_width :])
        )
    return torch.cat(outputs).cpu()


def has_active_dropout(model: nn.Module) -> bool:
    """Whether training mode makes `model`'s forward random: a dropout module (LoRA's among them) or a
    model config's dropout rate (Qwen2's and Llama's attention dropout is a functional argument)."""
    if any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    rates = config.to_dict() if config is not None and hasattr(config, "to_dict") else {}
    return any(
        ("dropout" in key or key.endswith("pdrop"))
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value > 0
        for key, value in rates.items()
    )


def combine_metric(name: str, values: list[float], weights: list[float] | None = None) -> float:
    """One value of a metric logged per micro-batch or per rank: the maximum of `*_max` metrics, the mean
    of the rest, weighted by `weights` when given (a micro-batch's tokens, or its share of the loss)."""
    if name.endswith("_max"):
        return max(values)
    if weights is None or sum(weights) <= 0:
        return sum(values) / len(values)
    return sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)


# Micro-batch losses weigh what they weigh in the objective (the share `_local_micro_batches` gives them);
# every other micro-batch statistic is a mean over the micro-batch's response tokens and weighs its tokens,
# so a metric over the update is the one a single batch would give, however the rows were split.
_LOSS_METRICS = frozenset({"policy/loss", "critic/loss"})


def rollout_logprob_gap(engine: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """|rollout engine log-prob - trainer log-prob| of the sampled tokens under the same weights: the
    off-policy gap a separate rollout engine adds (numerics, dtype, a stale sync, top-k/top-p truncation);
    and the k1 estimate of KL(rollout policy || trainer policy) on tokens drawn from the rollout policy: ~0
    when in sync, the staleness cost in async mode."""
    return {name: float(value) for name, value in _logprob_gap(engine, trainer, mask).items()}


def _logprob_gap(engine: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    diff = (engine - trainer).abs() * mask
    return {
        "rollout/logprob_diff_max": diff.max(),
        "rollout/logprob_diff_mean": masked_mean(diff, mask),
        "kl/rollout_vs_policy": masked_mean(engine - trainer, mask),
    }


def _lr_lambda(cfg: RunConfig):
    total, warmup, schedule = cfg.train.steps, cfg.train.warmup_steps, cfg.train.lr_schedule

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress

    return factor


def refuse_rank_states(state: dict[str, Any]) -> None:
    """A state written by several trainer ranks (`rl_engine.distributed`) cannot resume one process."""
    if "ranks" in state:
        raise ValueError(
            f"the checkpoint's trainer state is from {len(state['ranks'])} trainer ranks, this run is one "
            "process (placement): resume with the placement it was written with"
        )


class TorchTrainer:
    """AdamW on one process, or data parallel over `world` processes (one per rank, gloo or NCCL).
    `micro_batch_size` bounds memory (gradient accumulation); the optimiser steps once per mini-batch;
    the learning-rate schedule advances once per RL step.

    Device: the models are on `device` (default: where the policy's weights are); each micro-batch goes
    there once, and the step's statistics come back in one copy at the end of `update`, so nothing waits
    on the GPU in between. Under mixed precision (`rl_engine.devices.precision_for`: bf16 on CUDA) the
    weights AdamW steps are fp32 and every forward runs under autocast.

    Data parallel: every rank receives the whole `Experience` and draws the same shuffled mini-batches
    (same generator seed); rank r trains rows r, r+world, ... of each, each micro-batch's loss weighted
    by its share of the *whole* mini-batch times `world`, so averaging the gradients over ranks gives
    exactly the one-process gradient."""

    def __init__(
        self,
        cfg: RunConfig,
        model: nn.Module,
        ref_model: nn.Module | None,
        critic: ValueModel | None,
        *,
        rank: int = 0,
        world: int = 1,
        device: torch.device | None = None,
    ):
        self.cfg = cfg
        self.rank = rank
        self.world = world
        self.model = model
        self.ref_model = ref_model
        self.critic = critic
        self.device = device or module_device(model)
        self.precision = precision_for(cfg, self.device)
        train = cfg.train
        # Only what trains: with LoRA the frozen base has no optimizer state at all.
        self.optimizer = self._adamw([p for p in model.parameters() if p.requires_grad], train.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda(cfg))
        self.critic_optimizer = None
        if critic is not None:
            self.critic_optimizer = self._adamw(list(critic.parameters()), cfg.algorithm.critic_lr or train.lr)
        self.flop_counts = [model_flops(m) for m in (model, critic) if m is not None]
        self.peak_flops = peak_flops(self.device, self.precision.compute, cfg.placement.device_peak_tflops)
        # Shuffles mini-batches; its state is checkpointed so a resumed run shuffles identically.
        self.generator = torch.Generator().manual_seed(cfg.seed)
        # Without active dropout the training forward's log-probs are the eval forward's, so the rollout
        # engine's log-probs can be checked against them at no cost (see `Experience.rollout_logprobs`).
        self.exact_training_logprobs = not has_active_dropout(model)

    # --- forward passes -------------------------------------------------------------------------

    def _adamw(self, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        """AdamW over `params`; torch's fused kernel on CUDA (one launch per step instead of one per tensor)."""
        train = self.cfg.train
        fused = self.device.type == "cuda" or None
        return torch.optim.AdamW(params, lr=lr, betas=train.betas, weight_decay=train.weight_decay, fused=fused)

    @torch.no_grad()
    def forward(self, batch: TokenBatch, which: str) -> torch.Tensor:
        """Log-probs of the response tokens under the `policy` or `reference`, or the critic's `values`,
        computed micro-batch by micro-batch on the trainer's device; returned on the CPU."""
        micro = self.cfg.train.micro_batch_size
        with self.precision.autocast():
            if which == "values":
                critic = self._runner("critic")
                parts = [critic(batch.select(slice(s, s + micro)).to(self.device)) for s in range(0, len(batch), micro)]
                return torch.cat(parts).cpu()
            return batched_logprobs(self._runner(which), batch, micro, self.cfg.rollout.temperature, self.device)

    # --- the update ------------------------------------------------------------------------------

    def _minibatches(self, size: int) -> list[torch.Tensor]:
        """Shuffled mini-batches that keep each prompt's group of samples together."""
        group = self.cfg.rollout.samples_per_prompt
        mini = self.cfg.train.mini_batch_size or size
        groups = torch.randperm(size // group, generator=self.generator) if size % group == 0 else None
        order = (
            (groups[:, None] * group + torch.arange(group)).reshape(-1) if groups is not None else torch.arange(size)
        )
        return list(order.split(mini))

    def update(self, exp: Experience) -> dict[str, float]:
        cfg = self.cfg
        started = time.perf_counter()
        self.model.train()
        logged: dict[str, list[tuple[torch.Tensor | float, torch.Tensor | float]]] = {}
        flops = 0.0

        def record(name: str, value: torch.Tensor | float, weight: torch.Tensor | float = 1.0) -> None:
            logged.setdefault(name, []).append((value, weight))

        for _ in range(cfg.train.epochs_per_batch):
            for mini_index in self._minibatches(len(exp.batch)):
                mini = exp.select(mini_index)
                self._zero_grad()
                for micro, share in self._local_micro_batches(mini):
                    stats = self._micro_step(micro.to(self.device), share)
                    if share > 0:  # a padding micro-batch (share 0) only keeps the ranks' collectives in step
                        flops += sum(c.train_flops(micro.batch.attention_mask.sum(1)) for c in self.flop_counts)
                        tokens = micro.batch.response_mask.sum()
                        for name, value in stats.items():
                            record(name, value, share if name in _LOSS_METRICS else tokens)
                record("policy/grad_norm", self._clip_and_step("policy"))
                if self.critic is not None:
                    record("critic/grad_norm", self._clip_and_step("critic"))
        self.scheduler.step()
        metrics = self._fetch(logged)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the optimizer's last kernels belong to this update's time
        self._record_rates(metrics, flops, time.perf_counter() - started)
        return metrics

    def _record_rates(self, metrics: dict[str, float], flops: float, seconds: float) -> None:
        """The learning rates the update stepped with, and its model-FLOPs utilisation over `seconds`."""
        metrics["policy/lr"] = self.optimizer.param_groups[0]["lr"]
        if self.critic_optimizer is not None:
            metrics["critic/lr"] = self.critic_optimizer.param_groups[0]["lr"]
        if self.peak_flops:
            metrics["throughput/train_mfu"] = mfu(flops, seconds, self.peak_flops)

    def _fetch(self, logged: dict[str, list[tuple[torch.Tensor | float, torch.Tensor | float]]]) -> dict[str, float]:
        """Each metric's weighted value over the update's micro-batches (`combine_metric`), read off the
        device in one copy: a read per value would wait for the GPU at every micro-batch."""
        names = [name for name, pairs in logged.items() for _ in pairs]
        flat = [
            torch.as_tensor(x, dtype=torch.float32).to(self.device).reshape(())
            for pairs in logged.values()
            for pair in pairs
            for x in pair
        ]
        read = torch.stack(flat).tolist() if flat else []
        values: dict[str, list[float]] = {}
        weights: dict[str, list[float]] = {}
        for name, value, weight in zip(names, read[0::2], read[1::2], strict=True):
            values.setdefault(name, []).append(value)
            weights.setdefault(name, []).append(weight)
        return {name: combine_metric(name, values[name], weights[name]) for name in values}

    def _local_micro_batches(self, mini: Experience) -> list[tuple[Experience, float]]:
        """This rank's micro-batches of `mini` with the weight of each one's loss. Every rank gets the
        same number of micro-batches (a rank one row short trains a copy of row 0 with weight 0): under
        ZeRO each backward and step is a collective that all ranks must enter."""
        micro_size = self.cfg.train.micro_batch_size
        total_tokens = float(mini.batch.response_mask.sum().clamp(min=1))
        rows = torch.arange(self.rank, len(mini.batch), self.world)
        most_rows = -(-len(mini.batch) // self.world)
        parts: list[tuple[Experience, float]] = []
        for start in range(0, len(rows), micro_size):
            micro = mini.select(rows[start : start + micro_size])
            parts.append((micro, self._share(micro, len(mini.batch), total_tokens) * self.world))
        while len(parts) < -(-most_rows // micro_size):
            parts.append((mini.select(torch.tensor([0])), 0.0))
        return parts

    def _share(self, micro: Experience, mini_size: int, mini_tokens: float) -> float:
        """Weight of a micro-batch's loss in its mini-batch, so accumulation equals one big batch."""
        if self.cfg.algorithm.aggregation == "token_mean":
            return float(micro.batch.response_mask.sum()) / mini_tokens
        return len(micro.batch) / mini_size

    def _micro_step(self, exp: Experience, share: float) -> dict[str, torch.Tensor]:
        """One micro-batch's forward and backward, `exp` already on the device; its statistics stay there."""
        alg = self.cfg.algorithm
        mask = exp.batch.response_mask
        tokens = exp.batch.sequences[:, exp.batch.prompt_width :]
        with self.precision.autocast():
            logits = response_logits(self._runner("policy"), exp.batch, self.cfg.rollout.temperature)
        logprobs = token_logprobs(logits, tokens)
        old = exp.old_logprobs if exp.old_logprobs is not None else logprobs.detach()
        norm = self.cfg.rollout.max_new_tokens
        agg = alg.aggregation
        loss, stats = policy_loss(
            logprobs,
            old,
            exp.advantages,
            mask,
            *alg.clip_range,
            alg.dual_clip,
            agg,
            norm,
            name=alg.policy_loss,
            weights=exp.correction_weights,
            behaviour_logprobs=exp.behaviour_logprobs,
        )
        out = {
            "policy/loss": loss.detach(),
            "policy/clip_ratio": stats["clip_ratio"],
            "policy/clip_ratio_high": stats["clip_ratio_high"],
            "policy/clip_ratio_low": stats["clip_ratio_low"],
            "policy/approx_kl": stats["approx_kl"],
            "policy/ratio_max": stats["ratio_max"],
        }
        if exp.rollout_logprobs is not None and exp.old_logprobs is None and self.exact_training_logprobs:
            out.update(_logprob_gap(exp.rollout_logprobs, logprobs.detach(), mask))
        if alg.entropy_coef > 0:
            entropy = entropy_from_logits(logits)
            loss = loss - alg.entropy_coef * aggregate(entropy, mask, agg, norm)
        else:
            with torch.no_grad():
                entropy = entropy_from_logits(logits)
        out["policy/entropy"] = masked_mean(entropy.detach(), mask)
        if exp.ref_logprobs is not None and alg.kl.placement == "loss" and alg.kl.coef > 0:
            kl = kl_estimate(logprobs, exp.ref_logprobs, alg.kl.estimator, mask)
            loss = loss + alg.kl.coef * aggregate(kl, mask, agg, norm)
            out["kl/mean"] = masked_mean(kl.detach(), mask)
        self._backward(loss * share, "policy")
        if self.critic is not None:
            with self.precision.autocast():
                values = self._runner("critic")(exp.batch)
            v_loss, v_stats = value_loss(values, exp.old_values, exp.returns, mask, alg.value_clip, agg, norm)
            self._backward(alg.value_coef * v_loss * share, "critic")
            out["critic/loss"] = v_loss.detach()
            out["critic/clip_ratio"] = v_stats["clip_ratio"]
            out["critic/values_mean"] = masked_mean(values.detach(), mask)
            out["returns/mean"] = masked_mean(exp.returns, mask)
        return out

    # --- the hooks a backend replaces ----------------------------------------------------------

    def _runner(self, which: str) -> nn.Module:
        """What runs `which`'s ("policy", "reference", "critic") forward passes."""
        return {"policy": self.model, "reference": self.ref_model, "critic": self.critic}[which]

    def _backward(self, loss: torch.Tensor, which: str) -> None:
        loss.backward()

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic_optimizer is not None:
            self.critic_optimizer.zero_grad(set_to_none=True)

    def _clip_and_step(self, which: str) -> torch.Tensor | float:
        """Clips `which`'s ("policy", "critic") gradients, takes its optimizer step; returns the
        gradient norm before clipping."""
        module, optimizer = (self.model, self.optimizer) if which == "policy" else self._critic_parts()
        self._average_gradients(module)
        clip = self.cfg.train.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(module.parameters(), clip if clip else float("inf"))
        optimizer.step()
        return norm.detach()

    def _critic_parts(self) -> tuple[ValueModel, torch.optim.Optimizer]:
        """The critic and its optimizer, for the paths that run only with a critic (ppo)."""
        assert self.critic is not None and self.critic_optimizer is not None  # __init__ makes them together
        return self.critic, self.critic_optimizer

    def _average_gradients(self, module: nn.Module) -> None:
        """Data parallel: the mean of every rank's gradient (each already weighted `world` times its
        share), i.e. the gradient of the whole mini-batch. One flat all-reduce, not one per tensor."""
        if self.world == 1:
            return
        import torch.distributed as dist

        grads = [p.grad for p in module.parameters() if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    # --- state -----------------------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's whole weights under Hugging Face's names (tied weights still share storage; LoRA
        adapters merged), for checkpoints. Valid until the next update."""
        if self.cfg.model.lora.enabled:
            from rl_engine.lora import merged_state_dict

            return merged_state_dict(self.model)
        return self.model.state_dict()

    def adapter_state_dict(self) -> dict[str, torch.Tensor] | None:
        """With LoRA, the adapter's tensors (peft's names) for the checkpoint's `adapter/`; else None."""
        if not self.cfg.model.lora.enabled:
            return None
        from rl_engine.lora import adapter_state_dict

        return adapter_state_dict(self.model)

    def weights_view(self) -> Any:
        """What a weight sync reads with `state_dict()` (inside `full_weights()`): the policy module, or
        with LoRA a view that merges the adapters."""
        if self.cfg.model.lora.enabled:
            from rl_engine.lora import MergedView

            return MergedView(self.model)
        return self.model

    def full_weights(self) -> AbstractContextManager[None]:
        """Inside, `self.model`'s parameters hold the whole weights (a weight sync reads them there);
        always so on one process."""
        return nullcontext()

    def state_dict(self) -> dict[str, Any]:
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
        }
        if self.critic is not None:
            critic, critic_optimizer = self._critic_parts()
            state["critic"] = critic.state_dict()
            state["critic_optimizer"] = critic_optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        refuse_rank_states(state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        if self.critic is not None:
            critic, critic_optimizer = self._critic_parts()
            critic.load_state_dict(state["critic"])
            critic_optimizer.load_state_dict(state["critic_optimizer"])
