"""How far behind the trainer a step's samples were generated: the `staleness/*` metrics.

A policy version is the number of updates applied to the weights; the step that trains with version
`v` has version `v` before its update. A token sampled under version `u` has staleness `v - u`
(sync mode: always 0; async mode: at most `backends.max_staleness`). Token-weighted, over every
sample of the step; see docs/ARCHITECTURE.md, "Async mode".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rl_engine.rollout import Sample


def staleness_metrics(samples: Sequence[Sample], trainer_version: int, max_staleness: int) -> dict[str, float]:
    """`staleness/mean`, `staleness/max`, `staleness/share_<lag>` (the share of tokens `lag` updates
    behind, for every lag from 0 to `max_staleness`: a histogram, one curve per bar) and
    `staleness/interrupted_fraction` (samples a weight sync split into several segments). {} when the
    samples carry no versions."""
    if not samples or any(s.segments is None for s in samples):
        return {}
    lags: Counter[int] = Counter()
    for sample in samples:
        for version, tokens in sample.segments or ():
            lags[trainer_version - version] += tokens
    tokens = sum(lags.values())
    if tokens == 0:
        return {}
    metrics = {
        "staleness/mean": sum(lag * count for lag, count in lags.items()) / tokens,
        "staleness/max": float(max(lags)),
        "staleness/interrupted_fraction": sum(len(s.segments or ()) > 1 for s in samples) / len(samples),
    }
    for lag in range(max(max_staleness, max(lags)) + 1):
        metrics[f"staleness/share_{lag}"] = lags[lag] / tokens
    return metrics
