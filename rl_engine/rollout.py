"""Rollout generation behind one interface; `transformers` here, vLLM plugs in behind the same one.

`generate` returns samples prompt-major: the `n` samples of prompt 0, then those of prompt 1, ... —
the layout every group estimator relies on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from rl_engine.trainer import module_device

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
    # Seeds the sampling of this one call (async mode: each batch its own, so that a resumed run draws
    # what the uninterrupted one drew); None = the engine's running generator.
    seed: int | None = None


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
    # The policy versions (updates applied to the weights that sampled) of the response, in order, as
    # (version, tokens) segments: one segment, or several when a partial rollout continued the response
    # under newer weights. None where nobody tracked it (sync mode: always the trainer's current version).
    segments: tuple[tuple[int, int], ...] | None = None
    # The entropy of the distribution each response token was drawn from (after temperature, top-k,
    # top-p), for the per-token view; None where the backend does not report it (vLLM, greedy).
    entropies: tuple[float, ...] | None = None

    @property
    def token_versions(self) -> list[int] | None:
        """The policy version of each response token (None without `segments`)."""
        if self.segments is None:
            return None
        return [version for version, tokens in self.segments for _ in range(tokens)]

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
    found = configured if isinstance(configured, list) else [configured]
    ids: list[int] = [i for i in found if i is not None]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError(
            "the model has no eos token (generation_config.eos_token_id and tokenizer.eos_token_id are unset)"
        )
    return ids


class SampledTokenLogprobs:
    """A logits processor that records each sampled token's log-prob under the distribution it was
    drawn from: put last, after temperature, top-k and top-p, it sees the scores `generate` samples from
    (vLLM's `processed_logprobs`). A step's token is known only at the next call (or from the output, for
    the last one), so one step's log-softmax is kept at a time: memory stays one `[batch, vocab]`. Each
    step's entropy of that distribution is kept too (`entropies`, `[batch, steps]`)."""

    def __init__(self) -> None:
        self.pending: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []
        self.entropy_steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            self.steps.append(self.pending.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.pending = torch.log_softmax(scores.float(), dim=-1)
        # Tokens that top-k/top-p removed have log-prob -inf and probability 0: they add nothing.
        plogp = self.pending.exp() * self.pending
        self.entropy_steps.append(-torch.where(torch.isfinite(self.pending), plogp, 0.0).sum(-1))
        return scores

    def entropies(self, generated: torch.Tensor) -> torch.Tensor:
        """`[batch, generated]` entropies of the distributions `generated`'s tokens were drawn from."""
        steps = self.entropy_steps[: generated.shape[1]]
        return torch.stack(steps, dim=1) if steps else generated.new_zeros((generated.shape[0], 0), dtype=torch.float32)

    def per_token(self, generated: torch.Tensor) -> torch.Tensor:
        """`[batch, generated]` log-probs of `generated` (the new tokens `generate` returned)."""
        steps = list(self.steps)
        if self.pending is not None and generated.shape[1] > len(steps):
            steps.append(self.pending.gather(-1, generated[:, len(steps) : len(steps) + 1]).squeeze(-1))
        return torch.stack(steps, dim=1) if steps else generated.new_zeros((generated.shape[0], 0), dtype=torch.float32)


@contextmanager
def seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Draws from a generator seeded with `seed` inside, leaving the process's own RNG as it was (in one
    process the trainer shares it); with None, draws from the running one."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def _warpers(params: SamplingParams) -> list[Any]:
    """transformers' temperature, top-k and top-p warpers for `params`, in the order `generate` applies them."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers: list[Any] = []
    if params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=params.top_p))
    return warpers


class TransformersRollout:
    """Samples with `model.generate`. In one process it is the very module being trained, so a weight
    sync costs nothing; as a rollout actor (`rl_engine.distributed`) it holds its own copy, loaded from
    the trainer's weights file after each update. Like vLLM it reports each sampled token's log-prob
    under the distribution it was drawn from (`SampledTokenLogprobs`), greedy decoding excepted.
    It generates on the model's device; prompts are left-padded and generated in chunks of `batch_size`;
    `autocast` wraps every forward (the trainer's mixed precision, `rl_engine.devices.Precision.autocast`)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        batch_size: int = 512,
        *,
        autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
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
            with self.autocast(), seeded(params.seed, self.device):
                for start in range(0, len(expanded), self.batch_size):
                    chunk = expanded[start : start + self.batch_size]
                    samples.extend(self._generate_chunk(chunk, params))
        finally:
            self.model.train(was_training)
        return samples

    def _generate_chunk(self, chunk: list[tuple[int, list[int]]], params: SamplingParams) -> list[Sample]:
        input_ids, attention_mask = left_pad([ids for _, ids in chunk], self.pad_id)
        kwargs: dict[str, Any] = dict(
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            use_cache=True,
        )
        recorder = None
        if params.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            recorder = SampledTokenLogprobs()
            # The warpers are ours, in transformers' own order, with the recorder after them: `generate`
            # puts a caller's processors before the warpers it builds itself. Temperature 1, top-k 0 (said
            # explicitly: transformers fills a top_k it was never given with 50) and top-p 1 keep it from
            # building any.
            kwargs.update(
                do_sample=True, temperature=1.0, top_p=1.0, top_k=0, logits_processor=[*_warpers(params), recorder]
            )
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        output = self.model.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), **kwargs
        )
        new_tokens = output[:, input_ids.shape[1] :]
        logprobs = recorder.per_token(new_tokens).tolist() if recorder is not None else [None] * len(chunk)
        entropies = recorder.entropies(new_tokens).tolist() if recorder is not None else [None] * len(chunk)
        return [
            self._to_sample(prompt_index, tokens, row_logprobs, params, row_entropies)
            for (prompt_index, _), tokens, row_logprobs, row_entropies in zip(
                chunk, new_tokens.tolist(), logprobs, entropies
            )
        ]

    def _to_sample(
        self,
        prompt_index: int,
        tokens: list[int],
        logprobs: list[float] | None,
        params: SamplingParams,
        entropies: list[float] | None = None,
    ) -> Sample:
        def sample(length: int, reason: FinishReason) -> Sample:
            kept = None if logprobs is None else tuple(logprobs[:length])
            entropy = None if entropies is None else tuple(entropies[:length])
            return Sample(prompt_index, tokens[:length], reason, kept, entropies=entropy)

        for position, token in enumerate(tokens):
            if token in self.eos_ids:
                return sample(position + 1, "stop")
        # No eos: either the budget ran out, or a stop string ended it early (then pads follow; a
        # sampled pad token is otherwise a real action and stays).
        length = len(tokens)
        while params.stop and length and tokens[length - 1] == self.pad_id and self.pad_id not in self.eos_ids:
            length -= 1
        return sample(length, "length" if length >= params.max_new_tokens else "stop")

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
