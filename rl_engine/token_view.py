"""The per-token view of a sample (the run page's sample dialog): for each response token its text, the
rollout engine's log-prob, the trainer's (the proximal policy, before the update), the entropy of the
distribution it was drawn from and its advantage, stored in the `samples` event as base64 float16 arrays
(2 bytes a value; see rl_engine/README.md, "Per-token view", for the bytes per step).

A field the step did not produce is left out: the trainer's log-probs exist when the step ran the
old-policy forward pass (async mode, a rollout correction, several updates per batch), the entropy
where the backend reports it (transformers sampling; not vLLM, not greedy decoding).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np

#: The float arrays of a view, in the order the dialog shows them.
FIELDS = ("rollout_logprob", "trainer_logprob", "entropy", "advantage")
#: A response longer than this keeps its first tokens in the view (the event stays bounded).
MAX_VIEW_TOKENS = 4096


def pack_f16(values: Sequence[float]) -> str:
    """`values` as little-endian float16, base64: about 2.7 characters a value (JSON's rounded decimals
    take 6 to 8)."""
    return base64.b64encode(np.asarray(values, dtype="<f2").tobytes()).decode("ascii")


def unpack_f16(text: str) -> list[float]:
    return np.frombuffer(base64.b64decode(text), dtype="<f2").astype(float).tolist()


def token_view(pieces: Sequence[str], arrays: dict[str, Sequence[float] | None]) -> dict[str, Any]:
    """The view of one response: `text` (each token's piece) and the packed `arrays` (names from
    `FIELDS`, each as long as `pieces`; None ones are left out)."""
    unknown = set(arrays) - set(FIELDS)
    if unknown:
        raise ValueError(f"token view: unknown fields {sorted(unknown)} (known: {', '.join(FIELDS)})")
    length = min(len(pieces), MAX_VIEW_TOKENS)
    view: dict[str, Any] = {"text": list(pieces[:length])}
    for name in FIELDS:
        values = arrays.get(name)
        if values is None:
            continue
        if len(values) < length:
            raise ValueError(f"token view: {name} has {len(values)} values for {length} tokens")
        view[name] = pack_f16(values[:length])
    return view
