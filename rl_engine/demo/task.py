"""The demo task: two-digit addition, e.g. prompt ``"37+48="`` with label ``"85"``.

Pure Python (no torch) so that data code can be imported cheaply. Every ordered pair
``(a, b)`` with ``10 <= a, b <= 99`` exists exactly once (8,100 pairs); a seeded shuffle
splits them into disjoint slices: the RL prompts (``train``), the held-out evaluation set
(``test``), the supervised warm-start slice (``sft``) and its validation slice (``sft_val``,
which only decides when the warm start stops).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

OPERAND_MIN = 10
OPERAND_MAX = 99
N_PAIRS = (OPERAND_MAX - OPERAND_MIN + 1) ** 2  # 8,100

Pair = tuple[int, int]


@dataclass(frozen=True)
class Split:
    train: list[Pair]
    test: list[Pair]
    sft: list[Pair]
    sft_val: list[Pair]


def all_pairs() -> list[Pair]:
    rng = range(OPERAND_MIN, OPERAND_MAX + 1)
    return [(a, b) for a in rng for b in rng]


def format_prompt(a: int, b: int) -> str:
    return f"{a}+{b}="


def format_answer(a: int, b: int) -> str:
    return str(a + b)


def to_row(pair: Pair) -> dict[str, str]:
    a, b = pair
    return {"prompt": format_prompt(a, b), "label": format_answer(a, b)}


def split_pairs(seed: int, n_train: int, n_test: int, n_sft: int, n_sft_val: int = 0) -> Split:
    """Shuffle all pairs with ``random.Random(seed)`` and cut disjoint slices."""
    if min(n_train, n_test, n_sft) < 1 or n_sft_val < 0:
        raise ValueError("train, test and sft need at least one pair each")
    total = n_train + n_test + n_sft + n_sft_val
    if total > N_PAIRS:
        raise ValueError(f"the splits ask for {total} pairs; only {N_PAIRS} two-digit pairs exist")
    pairs = all_pairs()
    random.Random(seed).shuffle(pairs)
    cuts = [0]
    for n in (n_test, n_train, n_sft, n_sft_val):
        cuts.append(cuts[-1] + n)
    test, train, sft, sft_val = (pairs[a:b] for a, b in zip(cuts, cuts[1:]))
    return Split(train=train, test=test, sft=sft, sft_val=sft_val)


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    # Fixed key order and separators keep the bytes identical for the same seed.
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, ensure_ascii=True) + "\n" for r in rows)
    path.write_bytes(text.encode("ascii"))


def read_jsonl(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
