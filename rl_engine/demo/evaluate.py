"""Greedy exact-match evaluation of a causal LM on ``{"prompt", "label"}`` rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GreedyResult:
    accuracy: float  # answer before the first eos equals the label
    eos_rate: float  # completions that emitted eos within max_new_tokens
    completions: list[str]  # text before the first eos (the whole text when none)


def greedy_completions(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    batch_size: int = 256,
    max_new_tokens: int = 8,
) -> tuple[list[str], list[bool]]:
    """Greedy-decode each prompt; return the text before eos and whether eos appeared.

    Batches are left-padded (whatever the tokenizer's own setting) so that every prompt ends
    at the last position and generation continues from it.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    was_training = model.training
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    model.eval()
    texts: list[str] = []
    ended: list[bool] = []
    try:
        with torch.inference_mode():
            for start in range(0, len(prompts), batch_size):
                batch = list(prompts[start : start + batch_size])
                enc = tokenizer(batch, return_tensors="pt", padding=True)
                out = model.generate(
                    input_ids=enc["input_ids"].to(model.device),
                    attention_mask=enc["attention_mask"].to(model.device),
                    do_sample=False,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=eos_id,
                    pad_token_id=pad_id,
                )
                new_tokens = out[:, enc["input_ids"].shape[1] :].tolist()
                for ids in new_tokens:
                    has_eos = eos_id in ids
                    if has_eos:
                        ids = ids[: ids.index(eos_id)]
                    texts.append(tokenizer.decode(ids, skip_special_tokens=True).strip())
                    ended.append(has_eos)
    finally:
        tokenizer.padding_side = old_side
        model.train(was_training)
    return texts, ended


def evaluate_greedy_detailed(
    model,
    tokenizer,
    rows: Sequence[dict],
    *,
    batch_size: int = 256,
    max_new_tokens: int = 8,
) -> GreedyResult:
    if not rows:
        raise ValueError("no rows to evaluate")
    texts, ended = greedy_completions(
        model,
        tokenizer,
        [r["prompt"] for r in rows],
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
    )
    # An answer counts only when the model also stopped: "85" followed by more digits is wrong.
    correct = sum(e and t == str(r["label"]).strip() for t, e, r in zip(texts, ended, rows))
    return GreedyResult(accuracy=correct / len(rows), eos_rate=sum(ended) / len(rows), completions=texts)


def evaluate_greedy(
    model,
    tokenizer,
    rows: Sequence[dict],
    batch_size: int = 256,
    max_new_tokens: int = 8,
) -> float:
    """Fraction of rows whose greedy answer (text before eos) equals ``row["label"]``."""
    return evaluate_greedy_detailed(
        model, tokenizer, rows, batch_size=batch_size, max_new_tokens=max_new_tokens
    ).accuracy
