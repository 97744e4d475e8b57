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
    metrics.update(_span_metrics(samples, trainer_version))
    return metrics


def _span_metrics(samples: Sequence[Sample], trainer_version: int) -> dict[str, float]:
    """Per sample (prime-rl's `off_policy/in_flight` and `in_queue`): `in_flight`, the updates that landed
    while it was generated (its newest token's version minus its oldest); `in_queue`, the updates since its
    last token (the trainer's version minus its newest)."""
    in_flight, in_queue = [], []
    for sample in samples:
        versions = [version for version, tokens in sample.segments or () if tokens]
        if versions:
            in_flight.append(max(versions) - min(versions))
            in_queue.append(trainer_version - max(versions))
    if not in_flight:
        return {}
    return {
        "staleness/in_flight_mean": sum(in_flight) / len(in_flight),
        "staleness/in_flight_max": float(max(in_flight)),
        "staleness/in_queue_mean": sum(in_queue) / len(in_queue),
        "staleness/in_queue_max": float(max(in_queue)),
    }
