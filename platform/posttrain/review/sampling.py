"""Which rollout samples a campaign reviews: the source spec and the selection rules (no database).

The source is a JSON object:

    {"runs": ["<run id>", ...],          # one or more runs (pair campaigns: one or two)
     "steps": [10, 20] | "step_range": [10, 20],   # optional; default every step with samples
     "rule": "random" | "lowest_reward" | "highest_reward" | "component_disagreement" | "reward_vs_component",
     "k": 4,                              # items per run and step (per step for pairs)
     "components": ["exact_answer", "format"],      # the disagreement rules only
     "seed": 0,
     "pair_steps": "same" | "latest"}     # pairs across two runs only

Scores (a sample without the needed reward or component is left out, except by `random`):
  lowest_reward / highest_reward  the sample's reward
  component_disagreement          max − min of the listed components (two or more)
  reward_vs_component             |reward − the one listed component| (the verifier against the reward)
The disagreement rules take the largest scores first.

Pairing rule (kind "pair"):
  one run      two different responses of one prompt group (same run, same step, same `group`).
               Within a group the samples are ordered by the rule (shuffled for `random`) and paired
               off in that order, so no sample is in two pairs of a step; the pairs of a step are then
               ranked by the rule and the first k kept.
  two runs     the same prompt text answered by both runs, either at the same step (`pair_steps`
               "same", k pairs per step) or at each run's latest step that has the prompt ("latest",
               k pairs in all). Each run contributes its first sample by the rule for that prompt.
  Pair scores: mean reward for lowest/highest_reward, the larger sample score for the disagreement
  rules. Pairs whose two responses are the same text are skipped (nothing to compare).

Everything is deterministic given the seed: the same source always selects the same items, in the
same (shuffled) queue order, with the same A/B display order.
"""

from __future__ import annotations

import math
import random
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from posttrain.core.errors import InvalidInput
from posttrain.core.json_values import json_integer

RULES: tuple[str, ...] = ("random", "lowest_reward", "highest_reward", "component_disagreement", "reward_vs_component")
PAIR_STEPS: tuple[str, ...] = ("same", "latest")
MAX_RUNS = 20
MAX_K = 1000
MAX_STEPS_LISTED = 10_000
MAX_SEED = 2**31 - 1
_SOURCE_FIELDS = {"runs", "steps", "step_range", "rule", "k", "components", "seed", "pair_steps"}


@dataclass(frozen=True)
class Candidate:
    """A rollout sample as selection needs it."""

    id: int
    run_id: str
    step: int
    index: int
    group: int
    reward: float | None
    components: dict[str, Any] = field(default_factory=dict)
    prompt: str = ""
    response: str = ""


@dataclass(frozen=True)
class Pick:
    sample_a: int
    sample_b: int | None
    selection: dict[str, Any]


# --- the source spec ---------------------------------------------------------------------------


def validate_source(raw: Any, campaign_kind: str) -> dict[str, Any]:
    """The source spec, normalised; InvalidInput naming each bad field (`source.k`)."""
    if not isinstance(raw, dict):
        raise InvalidInput.one("source", "required: an object with runs, rule and k")
    errors: list[dict[str, str]] = []
    for name in sorted(set(raw) - _SOURCE_FIELDS):
        errors.append(
            {"loc": f"source.{name}"[:300], "msg": f"unknown field (the fields: {', '.join(sorted(_SOURCE_FIELDS))})"}
        )
    runs = _runs(raw.get("runs"), campaign_kind, errors)
    rule = raw.get("rule", "random")
    if rule not in RULES:
        errors.append({"loc": "source.rule", "msg": f"must be one of {', '.join(RULES)}, got {rule!r}"[:300]})
    k = json_integer(raw.get("k", 1))
    if k is None or not 1 <= k <= MAX_K:
        errors.append({"loc": "source.k", "msg": f"must be an integer from 1 to {MAX_K} (items per step)"})
    seed = json_integer(raw.get("seed", 0))
    if seed is None or not 0 <= seed <= MAX_SEED:
        errors.append({"loc": "source.seed", "msg": f"must be an integer from 0 to {MAX_SEED}"})
    steps, step_range = _steps(raw, errors)
    components = _components(raw.get("components"), rule, errors)
    source: dict[str, Any] = {
        "runs": runs,
        "steps": steps,
        "step_range": step_range,
        "rule": rule,
        "k": k,
        "components": components,
        "seed": seed,
    }
    across_runs = campaign_kind == "pair" and len(runs) == 2
    pair_steps = raw.get("pair_steps")
    if across_runs:
        pair_steps = "same" if pair_steps is None else pair_steps
        if pair_steps not in PAIR_STEPS:
            errors.append({"loc": "source.pair_steps", "msg": f"must be one of {', '.join(PAIR_STEPS)}"})
        source["pair_steps"] = pair_steps
    elif pair_steps is not None:
        errors.append({"loc": "source.pair_steps", "msg": "applies only to pair campaigns across two runs"})
    if errors:
        raise InvalidInput(errors)
    return source


def _runs(raw: Any, campaign_kind: str, errors: list[dict[str, str]]) -> list[str]:
    if not isinstance(raw, list) or not raw:
        errors.append({"loc": "source.runs", "msg": "required: a list of one or more run ids"})
        return []
    if len(raw) > MAX_RUNS:
        errors.append({"loc": "source.runs", "msg": f"at most {MAX_RUNS} runs"})
        return []
    runs: list[str] = []
    for i, value in enumerate(raw):
        try:
            run_id = str(uuid.UUID(str(value)))
        except ValueError:
            errors.append({"loc": f"source.runs[{i}]", "msg": f"{str(value)[:50]!r} is not a run id"})
            continue
        if run_id in runs:
            errors.append({"loc": f"source.runs[{i}]", "msg": "this run is listed twice"})
        runs.append(run_id)
    if campaign_kind == "pair" and len(raw) > 2:
        errors.append(
            {
                "loc": "source.runs",
                "msg": "a pair campaign compares responses within one run (same prompt "
                "group) or across exactly two runs (same prompt)",
            }
        )
    return runs


def _steps(raw: dict[str, Any], errors: list[dict[str, str]]) -> tuple[list[int] | None, list[int] | None]:
    steps, step_range = raw.get("steps"), raw.get("step_range")
    if steps is not None and step_range is not None:
        errors.append({"loc": "source.steps", "msg": "give steps or step_range, not both"})
        return None, None
    if steps is not None:
        if not isinstance(steps, list) or not steps or len(steps) > MAX_STEPS_LISTED:
            errors.append({"loc": "source.steps", "msg": f"must be a list of 1 to {MAX_STEPS_LISTED} steps"})
            return None, None
        parsed = [json_integer(s) for s in steps]
        bad = next((i for i, s in enumerate(parsed) if s is None or s < 0), None)
        if bad is not None:
            errors.append({"loc": f"source.steps[{bad}]", "msg": "must be a step number (an integer ≥ 0)"})
            return None, None
        return sorted(set(parsed)), None
    if step_range is not None:
        bounds = (
            [json_integer(s) for s in step_range] if isinstance(step_range, list) and len(step_range) == 2 else [None]
        )
        if None in bounds or bounds[0] < 0 or bounds[1] < bounds[0]:
            errors.append({"loc": "source.step_range", "msg": "must be [first, last], steps ≥ 0, first ≤ last"})
            return None, None
        return None, [int(bound) for bound in bounds]
    return None, None


def _components(raw: Any, rule: Any, errors: list[dict[str, str]]) -> list[str]:
    needed = {"component_disagreement": 2, "reward_vs_component": 1}.get(rule)
    if needed is None:
        if raw not in (None, []):
            errors.append({"loc": "source.components", "msg": "only the disagreement rules use components"})
        return []
    if not isinstance(raw, list) or not all(isinstance(c, str) and c.strip() for c in raw):
        errors.append({"loc": "source.components", "msg": "must be a list of reward component names"})
        return []
    names = list(dict.fromkeys(c.strip() for c in raw))
    if rule == "component_disagreement" and len(names) < 2:
        errors.append({"loc": "source.components", "msg": "component_disagreement compares two or more components"})
    if rule == "reward_vs_component" and len(names) != 1:
        errors.append(
            {"loc": "source.components", "msg": "reward_vs_component compares the reward with exactly one component"}
        )
    return names


# --- scores -----------------------------------------------------------------------------------


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def sample_score(candidate: Candidate, rule: str, components: list[str]) -> float | None:
    """The sample's score by the rule; None when it lacks what the rule reads."""
    if rule == "random":
        return 0.0
    if rule in ("lowest_reward", "highest_reward"):
        return candidate.reward
    values = [_finite(candidate.components.get(name)) for name in components]
    if None in values:
        return None
    if rule == "component_disagreement":
        return max(values) - min(values)
    if candidate.reward is None:
        return None
    return abs(candidate.reward - values[0])


def _stable(candidate: Candidate) -> tuple[str, int, int]:
    return candidate.run_id, candidate.step, candidate.index


def _ordered(
    candidates: Iterable[Candidate], rule: str, components: list[str], rng: random.Random
) -> list[tuple[Candidate, float]]:
    """Candidates in the rule's order (best first) with their scores; unscorable ones dropped."""
    scored = [(c, sample_score(c, rule, components)) for c in sorted(candidates, key=_stable)]
    kept = [(c, s) for c, s in scored if s is not None]
    if rule == "random":
        rng.shuffle(kept)
        return kept
    sign = 1.0 if rule == "lowest_reward" else -1.0
    return sorted(kept, key=lambda cs: sign * cs[1])  # stable: ties keep (run, step, index) order


def _pair_score(rule: str, a: float, b: float) -> float:
    if rule in ("lowest_reward", "highest_reward"):
        return (a + b) / 2
    return max(a, b)


def _rank_pairs(
    pairs: list[tuple[Candidate, Candidate, float]], rule: str, rng: random.Random
) -> list[tuple[Candidate, Candidate, float]]:
    pairs = sorted(pairs, key=lambda p: (_stable(p[0]), _stable(p[1])))
    if rule == "random":
        rng.shuffle(pairs)
        return pairs
    sign = 1.0 if rule == "lowest_reward" else -1.0
    return sorted(pairs, key=lambda p: sign * p[2])


def _rng(seed: int, *parts: Any) -> random.Random:
    # A string seed is hashed with SHA-512: the same in every process, unlike hash().
    return random.Random(":".join(str(p) for p in (seed, *parts)))


def _score_or_none(rule: str, score: float) -> float | None:
    return None if rule == "random" else score


# --- selection --------------------------------------------------------------------------------


def select_singles(candidates: Iterable[Candidate], source: dict[str, Any]) -> list[Pick]:
    """k samples per (run, step) by the rule."""
    rule, k, components, seed = source["rule"], source["k"], source["components"], source["seed"]
    buckets: dict[tuple[str, int], list[Candidate]] = defaultdict(list)
    for c in candidates:
        buckets[(c.run_id, c.step)].append(c)
    picks: list[Pick] = []
    for run_id, step in sorted(buckets):
        ordered = _ordered(buckets[(run_id, step)], rule, components, _rng(seed, run_id, step))
        for candidate, score in ordered[:k]:
            picks.append(
                Pick(
                    candidate.id,
                    None,
                    {"rule": rule, "score": _score_or_none(rule, score), "step": step, "pairing": "single"},
                )
            )
    return picks


def _pair_off(ordered: list[tuple[Candidate, float]]) -> list[tuple[Candidate, Candidate, float, float]]:
    """Consecutive samples paired off, skipping a partner whose response is the same text."""
    pairs = []
    rest = list(ordered)
    while rest:
        first, first_score = rest.pop(0)
        partner = next((i for i, (c, _) in enumerate(rest) if c.response != first.response), None)
        if partner is None:
            continue
        second, second_score = rest.pop(partner)
        pairs.append((first, second, first_score, second_score))
    return pairs


def select_pairs_within_run(candidates: Iterable[Candidate], source: dict[str, Any]) -> list[Pick]:
    """k pairs per step, each two responses of one prompt group."""
    rule, k, components, seed = source["rule"], source["k"], source["components"], source["seed"]
    groups: dict[int, dict[int, list[Candidate]]] = defaultdict(lambda: defaultdict(list))
    for c in candidates:
        groups[c.step][c.group].append(c)
    picks: list[Pick] = []
    for step in sorted(groups):
        pairs = []
        for group in sorted(groups[step]):
            ordered = _ordered(groups[step][group], rule, components, _rng(seed, step, group))
            pairs += [(a, b, _pair_score(rule, sa, sb)) for a, b, sa, sb in _pair_off(ordered)]
        for a, b, score in _rank_pairs(pairs, rule, _rng(seed, step, "pairs"))[:k]:
            picks.append(
                Pick(
                    a.id,
                    b.id,
                    {
                        "rule": rule,
                        "score": _score_or_none(rule, score),
                        "step": step,
                        "pairing": "same_group",
                        "group": a.group,
                    },
                )
            )
    return picks


def select_pairs_across_runs(candidates: Iterable[Candidate], source: dict[str, Any]) -> list[Pick]:
    """Pairs of one response from each of the two runs to the same prompt text (sample_a from the first run)."""
    rule, k, components, seed = source["rule"], source["k"], source["components"], source["seed"]
    first_run, second_run = source["runs"]
    latest = source.get("pair_steps") == "latest"
    # bucket → prompt → run → samples; with "latest" one bucket, and each run's latest step per prompt.
    by_prompt: dict[Any, dict[str, dict[str, list[Candidate]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for c in candidates:
        by_prompt["latest" if latest else c.step][c.prompt][c.run_id].append(c)
    picks: list[Pick] = []
    for bucket in sorted(by_prompt):  # all steps, or the one "latest" bucket
        pairs = []
        for prompt in sorted(by_prompt[bucket]):
            runs = by_prompt[bucket][prompt]
            if first_run not in runs or second_run not in runs:
                continue
            best = []
            for run_id in (first_run, second_run):
                samples = runs[run_id]
                if latest:
                    last_step = max(c.step for c in samples)
                    samples = [c for c in samples if c.step == last_step]
                ordered = _ordered(samples, rule, components, _rng(seed, bucket, prompt, run_id))
                best.append(ordered[0] if ordered else None)
            if None in best or best[0][0].response == best[1][0].response:
                continue
            (a, sa), (b, sb) = best
            pairs.append((a, b, _pair_score(rule, sa, sb)))
        for a, b, score in _rank_pairs(pairs, rule, _rng(seed, bucket, "pairs"))[:k]:
            step: Any = a.step if a.step == b.step else {"a": a.step, "b": b.step}
            picks.append(
                Pick(
                    a.id,
                    b.id,
                    {"rule": rule, "score": _score_or_none(rule, score), "step": step, "pairing": "across_runs"},
                )
            )
    return picks


def select(candidates: list[Candidate], source: dict[str, Any], campaign_kind: str) -> list[Pick]:
    if campaign_kind == "single":
        return select_singles(candidates, source)
    if len(source["runs"]) == 1:
        return select_pairs_within_run(candidates, source)
    return select_pairs_across_runs(candidates, source)


def queue_order(picks: list[Pick], seed: int) -> list[tuple[Pick, bool]]:
    """Picks shuffled into queue order (annotators should not see a run's steps in sequence), each with
    whether a pair shows sample_b as "A" (annotators favour the first response shown)."""
    shuffled = list(picks)
    _rng(seed, "order").shuffle(shuffled)
    swap_rng = _rng(seed, "swap")
    return [(pick, pick.sample_b is not None and swap_rng.random() < 0.5) for pick in shuffled]
