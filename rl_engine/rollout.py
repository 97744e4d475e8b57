"""Rollout generation behind one interface; `transformers` here, vLLM plugs in behind the same one.

`generate` returns samples prompt-major: the `n` samples of prompt 0, then those of prompt 1, ... —
the layout every group estimator relies on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

import torch

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 16
    stop: tuple[str, ...] = ()
    greedy: bool = False


@dataclass(frozen=True)
class Sample:
    prompt_index: int  # index into the prompts passed to `generate`
    response_ids: list[int]  # generated tokens, the stop token included when one ended it
    finish_reason: FinishReason
    # The engine's log-prob of each response token under the distribution it sampled from (None when
    # the backend does not report them). Only for measuring the gap to the trainer, never for the loss.
    logprobs: tuple[float, ...] | None = None
    # Multi-turn trajectories (`rl_engine.executors`): 1 where the token is the policy's action, 0 where
    # it is an observation the environment inserted (no gradient, no KL, no entropy). None = all actions.
    action_mask: tuple[int, ...] | None = None

    @property
    def action_count(self) -> int:
        """The policy's own tokens: observations an environment inserted are not part of what it generated."""
        return sum(self.action_mask) if self.action_mask is not None else len(self.response_ids)


class RolloutBackend(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]: ...

    def sync_weights(self, model: torch.nn.Module) -> float:
        """Make the engine sample from `model`'s current weights; returns seconds spent."""
        ...

    def sleep(self) -> None:
        """Between a step's generation and its weight sync: give memory the trainer can use back (an
        engine that shares the trainer's GPU); the next generation or sync wakes it."""
        ...

    def close(self) -> None: ...


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    return ids, mask


def eos_token_ids(generation_config: Any, tokenizer: Any) -> list[int]:
    """The tokens that end a response: the generation config's eos ids plus the tokenizer's."""
    configured = getattr(generation_config, "eos_token_id", None)
    ids = configured if isinstance(configured, list) else [configured]
    ids = [i for i in ids if i is not None]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError(
            "the model has no eos token (generation_config.eos_token_id and tokenizer.eos_token_id are unset)"
        )
    return ids


class SampledLogprobs:
    """A logits processor for `generate` that keeps the log-prob of each sampled token under the distribution
    it was drawn from. `generate` runs its own processors, then this one, then the temperature / top-k /
    top-p warpers, so this one applies the same warpers (transformers' classes) to its copy; the token
    drawn at a step is the last input id of the next, where its log-prob is read."""

    def __init__(self, params: SamplingParams):
        from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        self.warpers: list[Any] = []
        if params.temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k > 0:
            self.warpers.append(TopKLogitsWarper(top_k=params.top_k))
        if params.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=params.top_p))
        self.latest: torch.Tensor | None = None  # [B, V] log-probs of the step just scored
        self.taken: list[torch.Tensor] = []  # [B] per generated token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.latest is not None:
            self.taken.append(self.latest.gather(-1, input_ids[:, -1:]).squeeze(-1))
        warped = scores
        for warper in self.warpers:
            warped = warper(input_ids, warped)
        self.latest = torch.log_softmax(warped.float(), dim=-1)
        return scores

    def logprobs(self, generated: torch.Tensor) -> torch.Tensor:
        """`[B, T]` log-probs of the `generated` tokens (T of them, the last one read off the final step)."""
        steps = list(self.taken)
        width = generated.shape[1]
        if len(steps) < width and self.latest is not None:
            steps.append(self.latest.gather(-1, generated[:, len(steps) : len(steps) + 1]).squeeze(-1))
        return torch.stack(steps, dim=1)[:, :width]


class TransformersRollout:
    """Samples with `model.generate` on the model's device. In one process it is the very module being
    trained, so a weight sync costs nothing, and with `sampling_logprobs` each token comes with its log-prob
    under the distribution it was sampled from (`SampledLogprobs`): the KV-cached decoding path, checked
    against the training forward (`rollout/logprob_diff_*`). As a rollout actor (`rl_engine.distributed`)
    it holds its own copy, loaded from the trainer's weights file after each update, and reports log-probs
    (`report_logprobs`) from one teacher-forced pass over the samples — those of the sampling distribution
    when top-k/top-p are off. Prompts are left-padded and generated in chunks of `batch_size`; `autocast`
    wraps every forward (the trainer's mixed precision, `rl_engine.devices.Precision.autocast`)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        batch_size: int = 512,
        report_logprobs: bool = False,
        *,
        sampling_logprobs: bool = False,
        autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ):
        from rl_engine.trainer import module_device  # trainer imports this module

        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.report_logprobs = report_logprobs
        self.sampling_logprobs = sampling_logprobs and not report_logprobs
        self.autocast = autocast
        self.device = module_device(model)
        self.eos_ids = eos_token_ids(model.generation_config, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        expanded = [(i, ids) for i, ids in enumerate(prompts) for _ in range(params.n)]
        samples: list[Sample] = []
        was_training = self.model.training
        self.model.eval()
        try:
            with self.autocast():
                for start in range(0, len(expanded), self.batch_size):
                    chunk = expanded[start : start + self.batch_size]
                    samples.extend(self._generate_chunk(chunk, params))
                if self.report_logprobs and not params.greedy:
                    samples = self._with_logprobs(prompts, samples, params.temperature)
        finally:
            self.model.train(was_training)
        return samples

    def _with_logprobs(self, prompts: list[list[int]], samples: list[Sample], temperature: float) -> list[Sample]:
        from rl_engine.trainer import TokenBatch, batched_logprobs  # trainer imports this module

        batch = TokenBatch.build(
            [prompts[s.prompt_index] for s in samples], [s.response_ids for s in samples], self.pad_id
        )
        logprobs = batched_logprobs(self.model, batch, 64, temperature)
        return [
            Sample(s.prompt_index, s.response_ids, s.finish_reason, tuple(logprobs[i, : len(s.response_ids)].tolist()))
            for i, s in enumerate(samples)
        ]

    def _generate_chunk(self, chunk: list[tuple[int, list[int]]], params: SamplingParams) -> list[Sample]:
        input_ids, attention_mask = left_pad([ids for _, ids in chunk], self.pad_id)
        kwargs: dict[str, Any] = dict(
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            use_cache=True,
        )
        if params.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(
                do_sample=True,
                temperature=params.temperature,
                top_p=params.top_p,
                # 0 = off, said explicitly: transformers fills a top_k it was never given with 50, and
                # top-50 samples scored under the full softmax would be off-policy.
                top_k=params.top_k if params.top_k > 0 else 0,
            )
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        recorder = SampledLogprobs(params) if self.sampling_logprobs and not params.greedy else None
        if recorder is not None:
            from transformers import LogitsProcessorList

            kwargs["logits_processor"] = LogitsProcessorList([recorder])
        output = self.model.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), **kwargs
        )
        new_tokens = output[:, input_ids.shape[1] :]
        generated = new_tokens.tolist()
        samples = [self._to_sample(prompt_index, tokens, params) for (prompt_index, _), tokens in zip(chunk, generated)]
        if recorder is None or new_tokens.shape[1] == 0:
            return samples
        logprobs = recorder.logprobs(new_tokens).tolist()
        return [replace(s, logprobs=tuple(row[: len(s.response_ids)])) for s, row in zip(samples, logprobs)]

    def _to_sample(self, prompt_index: int, tokens: list[int], params: SamplingParams) -> Sample:
        for position, token in enumerate(tokens):
            if token in self.eos_ids:
                return Sample(prompt_index, tokens[: position + 1], "stop")
        # No eos: either the budget ran out, or a stop string ended it early (then pads follow; a
        # sampled pad token is otherwise a real action and stays).
        while params.stop and tokens and tokens[-1] == self.pad_id and self.pad_id not in self.eos_ids:
            tokens = tokens[:-1]
        reason: FinishReason = "length" if len(tokens) >= params.max_new_tokens else "stop"
        return Sample(prompt_index, tokens, reason)

    def sync_weights(self, model: torch.nn.Module) -> float:
        return 0.0  # same module: nothing to move

    def sleep(self) -> None:
        pass  # holds nothing besides the policy itself

    def load_weights_file(self, path: str) -> float:
        """Takes the weights a trainer wrote (`write_weights_file`); returns seconds spent."""
        started = time.perf_counter()
        from safetensors.torch import load_file

        self.model.load_state_dict(load_file(path), strict=True)
        return time.perf_counter() - started

    def close(self) -> None:
        pass
