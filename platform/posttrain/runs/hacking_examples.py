"""Which rollouts of an alert's step show what the alert says: the `examples_rule` of an alert
(posttrain.runs.hacking, posttrain.runs.diagnostics) applied to the step's rollouts as
`posttrain.telemetry.selectors.rollouts_query` gives them (plain dicts, with their text).

Pure: the selectors read the rollouts and call `pick_examples`. A rule is a name, optionally with an
argument after a colon (`top_reward_low:exact_match`). The picked indices are what the run page links to and
what the review app's "alerts" rule takes as an alert's examples.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from rl_engine.spec.catalogues import (
    compression_ratio,
    ngram_repetition_rate,
    nonprintable_share,
    normalized_answer,
    top_answer,
)

EXAMPLES = 5
"""Five rollouts show a pattern; more is a list nobody reads from an alert."""

Rollout = dict[str, Any]


def _reward(rollout: Rollout) -> float:
    reward = rollout.get("reward")
    return float(reward) if reward is not None else float("-inf")


def _component(rollout: Rollout, name: str) -> float | None:
    value = (rollout.get("components") or {}).get(name)
    return float(value) if isinstance(value, (int, float)) else None


def _text_units(text: str) -> list[str]:
    """Words, or characters for a response without spaces (a looped "7777"), for repetition counting."""
    words = text.split()
    return words if len(words) > 1 else list(text)


def _ranked(rollouts: Sequence[Rollout], key: Callable[[Rollout], float | None], k: int) -> list[int]:
    """The indices of the `k` rollouts with the largest keys (None: left out), ties by index."""
    scored = [(value, r["index"]) for r in rollouts if (value := key(r)) is not None]
    scored.sort(key=lambda pair: (-pair[0], pair[1]))
    return [index for _, index in scored[:k]]


def _longest_well_paid(rollouts: Sequence[Rollout], k: int) -> list[int]:
    rewards = [_reward(r) for r in rollouts if r.get("reward") is not None]
    if not rewards:
        return []
    median = statistics.median(rewards)
    return _ranked(rollouts, lambda r: len(r.get("response") or "") if _reward(r) >= median else None, k)


def _component_over_others(rollouts: Sequence[Rollout], name: str, k: int) -> list[int]:
    def margin(rollout: Rollout) -> float | None:
        own = _component(rollout, name)
        others = [float(v) for c, v in (rollout.get("components") or {}).items() if c != name]
        return None if own is None or not others else own - statistics.fmean(others)

    return _ranked(rollouts, margin, k)


def _top_reward_low(rollouts: Sequence[Rollout], name: str, k: int) -> list[int]:
    """Well paid but failing the held-out measure's component: reward minus that component."""

    def gap(rollout: Rollout) -> float | None:
        own = _component(rollout, name)
        return None if own is None or rollout.get("reward") is None else _reward(rollout) - own

    return _ranked(rollouts, gap, k) or _ranked(rollouts, _reward, k)


def _tied_groups(rollouts: Sequence[Rollout], k: int) -> list[int]:
    """One rollout of each of the first `k` groups whose samples all scored the same."""
    groups: dict[int, list[Rollout]] = defaultdict(list)
    for rollout in sorted(rollouts, key=lambda r: r["index"]):
        groups[rollout["group"]].append(rollout)
    tied = [members[0]["index"] for _, members in sorted(groups.items()) if len({_reward(m) for m in members}) == 1]
    return tied[:k]


def _top_answer(rollouts: Sequence[Rollout], k: int) -> list[int]:
    top = top_answer([r.get("response") or "" for r in rollouts], [r["group"] for r in rollouts])
    if top is None:
        return []
    answer = top[0]
    same = sorted(r["index"] for r in rollouts if normalized_answer(r.get("response") or "") == answer)
    return same[:k]


def pick_examples(rule: str, rollouts: Sequence[Rollout], k: int = EXAMPLES) -> list[int]:
    """The indices of up to `k` of `rollouts` (one run, one step, with text) that `rule` picks; [] for a rule
    this module does not know (an alert from a newer server) or a step without rollouts."""
    name, _, argument = rule.partition(":")
    simple: dict[str, Callable[[Rollout], float | None]] = {
        "top_reward": _reward,
        "most_repetitive": lambda r: ngram_repetition_rate(_text_units(r.get("response") or "")),
        "most_nonprintable": lambda r: nonprintable_share(r.get("response") or ""),
        "most_compressible": lambda r: compression_ratio(r.get("response") or ""),
    }
    if name in simple:
        return _ranked(rollouts, simple[name], k)
    if name == "longest_well_paid":
        return _longest_well_paid(rollouts, k)
    if name == "component_over_others" and argument:
        return _component_over_others(rollouts, argument, k)
    if name == "top_reward_low" and argument:
        return _top_reward_low(rollouts, argument, k)
    if name == "tied_groups":
        return _tied_groups(rollouts, k)
    if name == "top_answer":
        return _top_answer(rollouts, k)
    return []
