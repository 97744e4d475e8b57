"""Partial rollout: generation in segments of a few tokens, so that a weight sync lands between two
segments instead of waiting for the whole batch; the unfinished responses continue under the new
weights, and every segment records the policy version that sampled it (`Sample.segments`).

A segment continues a response by giving the engine the prompt plus the response so far as its prompt:
the same tokens, the same positions, so the continuation is what one long `generate` would have drawn
from the same weights (the KV cache is rebuilt at each boundary: the price of the interruption). Any
engine with `generate` over token ids runs it; see docs/ARCHITECTURE.md, "Async mode".
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from rl_engine.rollout import FinishReason, RolloutBackend, Sample, SamplingParams


def mixed_seed(*parts: int) -> int:
    """A seed for one piece of work, from the run's seed and the piece's coordinates (batch, segment):
    distinct pieces draw independent streams, the same piece the same one."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass
class _Response:
    prompt_index: int
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    entropies: list[float] | None = field(default_factory=list)
    segments: list[tuple[int, int]] = field(default_factory=list)
    finish_reason: FinishReason = "length"

    def extend(self, segment: Sample, version: int) -> None:
        self.tokens.extend(segment.response_ids)
        if self.logprobs is not None and segment.logprobs is not None:
            self.logprobs.extend(segment.logprobs)
        else:
            self.logprobs = None  # greedy decoding reports none
        if self.entropies is not None and segment.entropies is not None:
            self.entropies.extend(segment.entropies)
        else:
            self.entropies = None
        if self.segments and self.segments[-1][0] == version:  # no sync in between: the same segment
            self.segments[-1] = (version, self.segments[-1][1] + len(segment.response_ids))
        elif segment.response_ids:
            self.segments.append((version, len(segment.response_ids)))
        self.finish_reason = segment.finish_reason

    def sample(self) -> Sample:
        logprobs = None if self.logprobs is None else tuple(self.logprobs)
        entropies = None if self.entropies is None else tuple(self.entropies)
        return Sample(
            self.prompt_index,
            self.tokens,
            self.finish_reason,
            logprobs,
            segments=tuple(self.segments),
            entropies=entropies,
        )


def generate_in_segments(
    backend: RolloutBackend,
    prompts: list[list[int]],
    params: SamplingParams,
    segment_tokens: int,
    at_boundary: Callable[[], int],
) -> list[Sample]:
    """`backend.generate(prompts, params)` in segments of at most `segment_tokens` new tokens.
    `at_boundary` runs before each segment: it applies weights that arrived meanwhile and returns the
    policy version the segment samples under. Samples come prompt-major, as `generate` returns them."""
    if segment_tokens < 1:
        raise ValueError(f"segment_tokens must be at least 1, got {segment_tokens}")
    responses = [_Response(i, ids) for i, ids in enumerate(prompts) for _ in range(params.n)]
    running = list(range(len(responses)))
    segment = 0
    while running:
        version = at_boundary()
        generated = len(responses[running[0]].tokens)  # every running response has drawn as many tokens
        seed = None if params.seed is None else mixed_seed(params.seed, segment)
        segment_params = replace(
            params, n=1, max_new_tokens=min(segment_tokens, params.max_new_tokens - generated), seed=seed
        )
        outputs = backend.generate([responses[i].prompt + responses[i].tokens for i in running], segment_params)
        for i, output in zip(running, outputs):
            responses[i].extend(output, version)
        # A response that used its whole segment without stopping goes on, until the budget is spent.
        running = [
            i
            for i in running
            if responses[i].finish_reason == "length" and len(responses[i].tokens) < params.max_new_tokens
        ]
        segment += 1
    return [response.sample() for response in responses]
