"""Statistics of responses that tell degenerate or gamed generations from real answers: how much of a
response repeats itself, how compressible it is, how much of it is not printable text, how close to uniform noise the policy was
while writing it, and how many prompts got one and the same answer.

Standard library only: the engine computes them per step (`step_response_metrics`, the `response/*`
metrics and the training-time filters, `rl_engine.rollout_filters`) and the platform ranks a step's stored
rollouts with the same functions when it picks examples for a hacking signal (`posttrain.runs.hacking`).
docs/REWARD_HACKING.md says what each one catches.
"""

from __future__ import annotations

import math
import statistics
import unicodedata
import zlib
from collections.abc import Hashable, Sequence

__all__ = [
    "COMPRESSION_MIN_BYTES",
    "REPETITION_NGRAM",
    "compression_ratio",
    "ngram_repetition_rate",
    "nonprintable_share",
    "normalized_answer",
    "step_response_metrics",
    "top_answer",
    "top_answer_group_share",
    "normalized_surprisal",
]

REPETITION_NGRAM = 4
"""Repetition is counted over 4-grams: a 4-gram that comes back is a loop, not a recurring word (a bigram
such as "of the" recurs in any long text)."""

COMPRESSION_MIN_BYTES = 64
"""Below 64 bytes the compressor's own block overhead outweighs what it saves: a short answer "compresses"
to more than its size whatever it says, so its ratio means nothing and it is left out."""

# Whitespace that text is made of; every other control or format character, a private-use or unassigned
# code point, a lone surrogate and U+FFFD (what a tokenizer decodes a broken byte sequence to) is not text.
_TEXT_CONTROLS = frozenset("\n\t\r")
_NOT_TEXT_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cn", "Cs"})
_REPLACEMENT = "\ufffd"


def ngram_repetition_rate(tokens: Sequence[Hashable], n: int = REPETITION_NGRAM) -> float:
    """The share of a response's n-grams that already occurred earlier in it: 0 for a response with no
    repeated n-gram (or shorter than n + 1 tokens), approaching 1 for one token or phrase looped."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    total = len(tokens) - n + 1
    if total < 2:
        return 0.0
    seen: set[tuple[Hashable, ...]] = set()
    repeats = 0
    for start in range(total):
        gram = tuple(tokens[start : start + n])
        if gram in seen:
            repeats += 1
        seen.add(gram)
    return repeats / total


def compression_ratio(text: str) -> float | None:
    """Raw UTF-8 bytes over their DEFLATE-compressed size (Whisper's repetition check, which decodes again
    above 2.4): natural prose is near 1.5-2, a loop much higher, random characters near or below 1. None
    for a response shorter than COMPRESSION_MIN_BYTES (its ratio is the compressor's overhead)."""
    raw = text.encode("utf-8", errors="replace")
    if len(raw) < COMPRESSION_MIN_BYTES:
        return None
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw DEFLATE: no zlib header or checksum
    packed = compressor.compress(raw) + compressor.flush()
    return len(raw) / len(packed)


def nonprintable_share(text: str) -> float:
    """The share of a response's characters that are not text: controls other than newline, tab and
    carriage return, format and private-use characters, unassigned code points, lone surrogates and the
    replacement character U+FFFD. 0 for an empty response."""
    if not text:
        return 0.0
    bad = sum(
        1
        for char in text
        if char == _REPLACEMENT or (char not in _TEXT_CONTROLS and unicodedata.category(char) in _NOT_TEXT_CATEGORIES)
    )
    return bad / len(text)


def normalized_surprisal(logprobs: Sequence[float], vocab_size: int) -> float | None:
    """The mean surprisal of a response's sampled tokens (-log-prob, nats) over that of a uniform draw from
    the vocabulary (log vocab_size): near 1 for a policy emitting noise, typically 0.1-0.3 for text. The
    mean -log-prob of what was sampled estimates the entropy of the distributions it was sampled from, so
    this is how close to uniform the policy was while writing the response. None without log-probs."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be at least 2, got {vocab_size}")
    if not logprobs:
        return None
    return -statistics.fmean(logprobs) / math.log(vocab_size)


def normalized_answer(text: str) -> str:
    """A response as compared across prompts: case-folded, whitespace collapsed."""
    return " ".join(text.split()).casefold()


def top_answer(responses: Sequence[str], groups: Sequence[int]) -> tuple[str, int] | None:
    """The (normalized) response given for the most prompts, and for how many (an empty response counts:
    empty for every prompt is a pattern too); ties go to the answer seen first. None without responses."""
    if len(responses) != len(groups):
        raise ValueError(f"{len(responses)} responses but {len(groups)} group ids")
    prompts_per_answer: dict[str, set[int]] = {}
    for response, group in zip(responses, groups):
        prompts_per_answer.setdefault(normalized_answer(response), set()).add(group)
    if not prompts_per_answer:
        return None
    answer, prompts = max(prompts_per_answer.items(), key=lambda item: len(item[1]))
    return answer, len(prompts)


def top_answer_group_share(responses: Sequence[str], groups: Sequence[int]) -> float:
    """The share of the step's prompts (groups) that got the step's most common answer at least once.

    Answers to different prompts differ when they say something about the prompt; one same answer spreading
    over the prompts is a policy that stopped reading them: a format-only pattern ("<answer></answer>",
    "\\boxed{}", a fixed phrase a judge likes) that the reward pays for. On a task whose labels repeat
    (yes/no) the level is high from the start: what matters is its rise (the signal compares it with the
    run's early level). 0 without responses."""
    top = top_answer(responses, groups)
    if top is None:
        return 0.0
    return top[1] / len(set(groups))


def step_response_metrics(
    texts: Sequence[str],
    token_ids: Sequence[Sequence[int]],
    groups: Sequence[int],
    logprobs: Sequence[Sequence[float] | None] | None = None,
    vocab_size: int | None = None,
) -> dict[str, float]:
    """The step's `response/*` statistics, means over its responses: `response/repetition_rate`,
    `response/nonprintable_share`, `response/top_answer_group_share`; `response/compression_ratio` over the
    responses long enough to have one, `response/normalized_surprisal` over those with log-probs (when the
    vocabulary size is given)."""
    if not texts:
        return {}
    metrics = {
        "response/repetition_rate": statistics.fmean(ngram_repetition_rate(ids) for ids in token_ids),
        "response/nonprintable_share": statistics.fmean(nonprintable_share(text) for text in texts),
        "response/top_answer_group_share": top_answer_group_share(texts, groups),
    }
    ratios = [ratio for ratio in map(compression_ratio, texts) if ratio is not None]
    if ratios:
        metrics["response/compression_ratio"] = statistics.fmean(ratios)
    if logprobs is not None and vocab_size is not None:
        surprisals = [normalized_surprisal(lps, vocab_size) for lps in logprobs if lps]
        if surprisals:
            metrics["response/normalized_surprisal"] = statistics.fmean(s for s in surprisals if s is not None)
    return metrics
