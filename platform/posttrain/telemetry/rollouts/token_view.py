"""One rollout's per-token view (the sample dialog), and the responses to the same prompt."""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from posttrain.core.errors import NotFound
from posttrain.telemetry.rollouts.filters import RolloutFilter
from posttrain.telemetry.rollouts.gaps import Gap, gaps_payload, unique_gaps
from posttrain.telemetry.rollouts.query import rollouts_query
from posttrain.telemetry.rollouts.shown import MAX_VIEW_TOKENS
from posttrain.telemetry.rollouts.store import RunId, existing_names

MAX_SAME_PROMPT = 2000


def pack_f16(values: Sequence[float] | None) -> str | None:
    """Per-token values as base64 little-endian float16 (the dialog's wire format)."""
    if values is None:
        return None
    array = np.asarray([math.nan if v is None else v for v in values], dtype="<f2")
    return base64.b64encode(array.tobytes()).decode("ascii")


# The dialog's arrays, by its name: the file's column.
VIEW_COLUMNS = {
    "rollout_logprob": "rollout_logprob",
    "trainer_logprob": "trainer_logprob",
    "entropy": "entropy",
    "advantage": "token_advantage",
}


def packed_view(row: dict[str, Any]) -> dict[str, Any]:
    """A rollout's per-token view as the dialog reads it: {text: [piece], <array>: base64 float16 (one
    value per piece), versions, and `truncated` when the query cut it: {column: its full length}}; {}
    when its step recorded none. The query cut each list at MAX_VIEW_TOKENS (rows_query's SHOWN); a row
    read otherwise is cut here."""
    text = row.get("token_text") or []
    if not text:
        return {}
    cut = {
        name: size
        for name, size in (row.get("truncated") or {}).items()
        if name.split(".")[0] in ("token_text", "versions", *VIEW_COLUMNS.values())
    }
    if len(text) > MAX_VIEW_TOKENS:
        cut.setdefault("token_text", len(text))
    view: dict[str, Any] = {"text": text[:MAX_VIEW_TOKENS]}
    for name, column in VIEW_COLUMNS.items():
        values = row.get(column)
        if values is not None:
            view[name] = pack_f16(values[:MAX_VIEW_TOKENS])
    if row.get("versions"):
        view["versions"] = [list(v) for v in row["versions"][:MAX_VIEW_TOKENS]]
    if cut:
        view["truncated"] = cut
    return view


def rollout_token_view(run_id: RunId, step: int, index: int) -> dict[str, Any]:
    """One rollout's per-token view ({text, <array>: base64 float16, versions, truncated}) and the
    responses to the same prompt at every step ([{step, index}], at most MAX_SAME_PROMPT), with the gaps
    of the files the same-prompt search could not read. NotFound names the rollout (and its file when
    that cannot be read)."""
    present = {(str(run_id), n) for n in existing_names(run_id)}
    gaps: list[Gap] = []
    rows = list(
        rollouts_query(
            [run_id],
            filters=RolloutFilter(steps=[step], index=index),
            columns=["prompt", "versions", "token_text", *VIEW_COLUMNS.values()],
            limit=1,
            present=present,
            gaps=gaps,
            whole=("prompt",),  # the same-prompt search matches it exactly (the file's bounds hold its size)
        )
    )
    if not rows:
        unreadable = f" ({gaps[0].reason})" if gaps else ""
        raise NotFound(f"run {run_id} has no rollout {index} at step {step}{unreadable}")
    found = rows[0]
    same = rollouts_query(
        [run_id],
        filters=RolloutFilter(prompt=found["prompt"]),
        columns=("step", "index"),
        limit=MAX_SAME_PROMPT,
        present=present,
        gaps=gaps,
    )
    return {
        "step": step,
        "index": index,
        "tokens": packed_view(found),
        "same_prompt": [{"step": r["step"], "index": r["index"]} for r in same],
        "gaps": gaps_payload(unique_gaps(gaps)),
    }
