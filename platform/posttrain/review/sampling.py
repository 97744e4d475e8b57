"""Which rollouts a campaign reviews: the source spec and the selection rules (no database). The
rollouts come from posttrain.telemetry.selectors.rollouts_query as plain dicts (`Candidate.from_rollout`).

The source is a JSON object:

    {"runs": ["<run id>", ...],          # one or more runs (pair campaigns: one or two)
     "steps": [10, 20] | "step_range": [10, 20],   # optional; default every step with samples
     "rule": "random" | "lowest_reward" | "highest_reward" | "component_disagreement" | "reward_vs_component"
             | "near_boundary" | "reward_vs_judge" | "alerts" | "one_per_group",
     "k": 4,                              # items per run and step (per step for pairs)
     "components": ["exact_answer", "format"],      # the component rules only
     "boundary": 0.5,                     # near_boundary only (default 0.5)
     "judge_run": 12,                     # reward_vs_judge only: a finished judge run over these runs
     "alerts": [{"run": "<id>", "step": 40, "indices": [3, 7], "code": "kl_blowup"}],  # alerts only
     "seed": 0,
     "pair_steps": "same" | "latest"}     # pairs across two runs only

Scores (a sample without the needed reward, component or judge score is left out, except by `random`):
  lowest_reward / highest_reward  the sample's reward
  component_disagreement          max − min of the listed components (two or more)
  reward_vs_component             |reward − the one listed component| (the verifier against the reward)
  near_boundary                   |reward − boundary|, the smallest first: the samples the reward was
                                  least sure about (a reward model's 0, a verifier's 0.5)
  reward_vs_judge                 |reward − the judge's score| (a judge run scored the runs' rollouts
                                  first, on a worker): where a second opinion disputes the reward
The disagreement rules take the largest scores first.

The last two rules of single campaigns pick without a score:
  alerts          the steps a run's alerts point to (posttrain.runs.diagnostics): k samples of each
                  alert's step, at random, or exactly the alert's `indices` when it names its examples
                  (a hacking signal's). Without `alerts` in the source the runs' current alerts are
                  used (the service fills them in, and the campaign keeps them); the steps come from
                  the alerts, so `steps` and `step_range` are refused.
  one_per_group   one sample from each of k prompt groups per run and step (GRPO's groups: k different
                  prompts, none seen twice), the groups and the sample in each at random.

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

RULES: tuple[str, ...] = (
    "random",
    "lowest_reward",
    "highest_reward",
    "component_disagreement",
    "reward_vs_component",
    "near_boundary",
    "reward_vs_judge",
    "alerts",
    "one_per_group",
)
SINGLE_ONLY_RULES: frozenset[str] = frozenset({"near_boundary", "reward_vs_judge", "alerts", "one_per_group"})
PAIR_STEPS: tuple[str, ...] = ("same", "latest")
MAX_RUNS = 20
MAX_K = 1000
MAX_STEPS_LISTED = 10_000
MAX_ALERTS = 1000
MAX_SEED = 2**31 - 1
DEFAULT_BOUNDARY = 0.5
_SOURCE_FIELDS = {
    "runs",
    "steps",
    "step_range",
    "rule",
    "k",
    "components",
    "seed",
    "pair_steps",
    "boundary",
    "judge_run",
    "alerts",
}

RolloutKey = tuple[str, int, int]  # (run id, step, index)


@dataclass(frozen=True)
class Candidate:
    """A rollout as selection needs it (`judge`: a judge run's score of it, for reward_vs_judge)."""

    run_id: str
    step: int
    index: int
    group: int
    reward: float | None
    components: dict[str, Any] = field(default_factory=dict)
    prompt: str = ""
    response: str = ""
    judge: float | None = None

    @property
    def key(self) -> RolloutKey:
        return (self.run_id, self.step, self.index)

    @classmethod
    def from_rollout(cls, rollout: dict[str, Any], judge: float | None = None) -> Candidate:
        return cls(
            run_id=rollout["run"],
            step=rollout["step"],
            index=rollout["index"],
            group=rollout["group"],
            reward=rollout["reward"],
            components=rollout["components"],
            prompt=rollout.get("prompt", ""),
            response=rollout.get("response", ""),
            judge=judge,
        )


@dataclass(frozen=True)
class Pick:
    """An item to make: the key of its rollout (a RolloutKey, or a gold row's key) and, for pairs, the
    second one's, with why it was picked."""

    a: Any
    b: Any | None
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
    if rule in SINGLE_ONLY_RULES and campaign_kind != "single":
        errors.append({"loc": "source.rule", "msg": f"{rule} picks single responses: use a single campaign"})
    source.update(_rule_fields(raw, rule, runs, errors))
    source.update(_pair_steps_field(raw, campaign_kind, runs, errors))
    if errors:
        raise InvalidInput(errors)
    return source


def _pair_steps_field(
    raw: dict[str, Any], campaign_kind: str, runs: list[str], errors: list[dict[str, str]]
) -> dict[str, Any]:
    """pair_steps, which only a pair campaign across two runs has (default "same"); refused elsewhere."""
    across_runs = campaign_kind == "pair" and len(runs) == 2
    pair_steps = raw.get("pair_steps")
    if across_runs:
        pair_steps = "same" if pair_steps is None else pair_steps
        if pair_steps not in PAIR_STEPS:
            errors.append({"loc": "source.pair_steps", "msg": f"must be one of {', '.join(PAIR_STEPS)}"})
        return {"pair_steps": pair_steps}
    if pair_steps is not None:
        errors.append({"loc": "source.pair_steps", "msg": "applies only to pair campaigns across two runs"})
    return {}


def _rule_fields(raw: dict[str, Any], rule: Any, runs: list[str], errors: list[dict[str, str]]) -> dict[str, Any]:
    """The fields only one rule reads: each refused under another rule, checked under its own."""
    fields: dict[str, Any] = {}
    own = {"boundary": "near_boundary", "judge_run": "reward_vs_judge", "alerts": "alerts"}
    for name, owner in own.items():
        if raw.get(name) is not None and rule != owner:
            errors.append({"loc": f"source.{name}", "msg": f"only the {owner} rule uses {name}"})
    if rule == "near_boundary":
        boundary = raw.get("boundary", DEFAULT_BOUNDARY)
        if isinstance(boundary, bool) or not isinstance(boundary, (int, float)) or not math.isfinite(boundary):
            errors.append({"loc": "source.boundary", "msg": "must be a number: the reward's decision boundary"})
        else:
            fields["boundary"] = float(boundary)
    elif rule == "reward_vs_judge":
        judge_run = json_integer(raw.get("judge_run"))
        if judge_run is None or judge_run < 1:
            errors.append(
                {"loc": "source.judge_run", "msg": "required: the id of a judge run that scored these runs' rollouts"}
            )
        fields["judge_run"] = judge_run
    elif rule == "alerts":
        if raw.get("steps") is not None or raw.get("step_range") is not None:
            errors.append({"loc": "source.steps", "msg": "the alerts rule takes its steps from the alerts"})
        fields["alerts"] = None if raw.get("alerts") is None else _alerts(raw["alerts"], runs, errors)
    return fields


def _alerts(raw: Any, runs: list[str], errors: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Alert pointers: {"run", "step", "indices" (optional: the alert's own examples), "code"}."""
    if not isinstance(raw, list) or not raw or len(raw) > MAX_ALERTS:
        errors.append({"loc": "source.alerts", "msg": f"must be a list of 1 to {MAX_ALERTS} alerts"})
        return []
    alerts = []
    for i, entry in enumerate(raw):
        loc = f"source.alerts[{i}]"
        if not isinstance(entry, dict) or not set(entry) <= {"run", "step", "indices", "code"}:
            errors.append({"loc": loc, "msg": 'must be {"run", "step", "indices" (optional), "code" (optional)}'})
            continue
        run = str(entry.get("run"))
        if run not in runs:
            errors.append({"loc": f"{loc}.run", "msg": "must be one of the source's runs"})
        step = json_integer(entry.get("step"))
        if step is None or step < 0:
            errors.append({"loc": f"{loc}.step", "msg": "must be a step number (an integer ≥ 0)"})
        indices = entry.get("indices")
        if indices is not None:
            parsed = [json_integer(v) for v in indices] if isinstance(indices, list) else [None]
            if not parsed or any(v is None or v < 0 for v in parsed):
                errors.append({"loc": f"{loc}.indices", "msg": "must be a list of sample indices (integers ≥ 0)"})
            else:
                indices = sorted(set(parsed))
        code = entry.get("code", "")
        alerts.append({"run": run, "step": step, "indices": indices, "code": str(code)[:100]})
    return alerts


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
        return sorted({s for s in parsed if s is not None}), None  # every one is a step past the check above
    if step_range is not None:
        first, last = (
            (json_integer(step_range[0]), json_integer(step_range[1]))
            if isinstance(step_range, list) and len(step_range) == 2
            else (None, None)
        )
        if first is None or last is None or first < 0 or last < first:
            errors.append({"loc": "source.step_range", "msg": "must be [first, last], steps ≥ 0, first ≤ last"})
            return None, None
        return None, [first, last]
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


def sample_score(candidate: Candidate, rule: str, components: list[str], boundary: float = 0.0) -> float | None:
    """The sample's score by the rule; None when it lacks what the rule reads."""
    if rule in ("random", "alerts", "one_per_group"):
        return 0.0
    if rule in ("lowest_reward", "highest_reward"):
        return candidate.reward
    if rule == "near_boundary":
        return None if candidate.reward is None else abs(candidate.reward - boundary)
    if rule == "reward_vs_judge":
        return None if candidate.reward is None or candidate.judge is None else abs(candidate.reward - candidate.judge)
    found = [_finite(candidate.components.get(name)) for name in components]
    values = [value for value in found if value is not None]
    if len(values) < len(found):
        return None
    if rule == "component_disagreement":
        return max(values) - min(values)
    if candidate.reward is None:
        return None
    return abs(candidate.reward - values[0])


def _stable(candidate: Candidate) -> tuple[str, int, int]:
    return candidate.run_id, candidate.step, candidate.index


_SMALLEST_FIRST = frozenset({"lowest_reward", "near_boundary"})


def _ordered(
    candidates: Iterable[Candidate], rule: str, components: list[str], rng: random.Random, boundary: float = 0.0
) -> list[tuple[Candidate, float]]:
    """Candidates in the rule's order (best first) with their scores; unscorable ones dropped."""
    scored = [(c, sample_score(c, rule, components, boundary)) for c in sorted(candidates, key=_stable)]
    kept = [(c, s) for c, s in scored if s is not None]
    if rule in ("random", "alerts", "one_per_group"):
        rng.shuffle(kept)
        return kept
    sign = 1.0 if rule in _SMALLEST_FIRST else -1.0
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
    return None if rule in ("random", "alerts", "one_per_group") else score


# --- selection --------------------------------------------------------------------------------


def select_singles(candidates: Iterable[Candidate], source: dict[str, Any]) -> list[Pick]:
    """k samples per (run, step) by the rule."""
    rule, k, components, seed = source["rule"], source["k"], source["components"], source["seed"]
    buckets: dict[tuple[str, int], list[Candidate]] = defaultdict(list)
    for c in candidates:
        buckets[(c.run_id, c.step)].append(c)
    if rule == "alerts":
        return _select_at_alerts(buckets, source)
    if rule == "one_per_group":
        return _select_one_per_group(buckets, source)
    picks: list[Pick] = []
    boundary = source.get("boundary", 0.0)
    for run_id, step in sorted(buckets):
        ordered = _ordered(buckets[(run_id, step)], rule, components, _rng(seed, run_id, step), boundary)
        for candidate, score in ordered[:k]:
            picks.append(
                Pick(
                    candidate.key,
                    None,
                    {"rule": rule, "score": _score_or_none(rule, score), "step": step, "pairing": "single"},
                )
            )
    return picks


def _select_at_alerts(buckets: dict[tuple[str, int], list[Candidate]], source: dict[str, Any]) -> list[Pick]:
    """k samples (or the alert's own examples) of each step an alert points to; two alerts at one step
    share its samples."""
    codes: dict[tuple[str, int], list[str]] = defaultdict(list)
    named: dict[tuple[str, int], set[int] | None] = {}
    for alert in source.get("alerts") or []:
        where = (alert["run"], alert["step"])
        codes[where].append(alert["code"])
        if alert["indices"] is None:
            named[where] = None
        elif named.get(where, set()) is not None:
            named[where] = (named.get(where) or set()) | set(alert["indices"])
    picks = []
    for where in sorted(codes):
        chosen = sorted(buckets.get(where, []), key=_stable)
        wanted = named[where]
        if wanted is None:
            _rng(source["seed"], *where).shuffle(chosen)
            chosen = chosen[: source["k"]]
        else:
            chosen = [c for c in chosen if c.index in wanted]
        for candidate in chosen:
            selection = {"rule": "alerts", "score": None, "step": where[1], "pairing": "single", "alerts": codes[where]}
            picks.append(Pick(candidate.key, None, selection))
    return picks


def _select_one_per_group(buckets: dict[tuple[str, int], list[Candidate]], source: dict[str, Any]) -> list[Pick]:
    picks = []
    for run_id, step in sorted(buckets):
        rng = _rng(source["seed"], run_id, step, "groups")
        groups: dict[int, list[Candidate]] = defaultdict(list)
        for candidate in sorted(buckets[(run_id, step)], key=_stable):
            groups[candidate.group].append(candidate)
        order = sorted(groups)
        rng.shuffle(order)
        for group in order[: source["k"]]:
            candidate = rng.choice(groups[group])
            selection = {"rule": "one_per_group", "score": None, "step": step, "pairing": "single", "group": group}
            picks.append(Pick(candidate.key, None, selection))
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
                    a.key,
                    b.key,
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
    """Pairs of one response from each of the two runs to the same prompt text (`a` from the first run)."""
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
            best: list[tuple[Candidate, float]] = []  # each run's best sample and its score
            for run_id in (first_run, second_run):
                samples = runs[run_id]
                if latest:
                    last_step = max(c.step for c in samples)
                    samples = [c for c in samples if c.step == last_step]
                ordered = _ordered(samples, rule, components, _rng(seed, bucket, prompt, run_id))
                if ordered:
                    best.append(ordered[0])
            if len(best) < 2 or best[0][0].response == best[1][0].response:
                continue
            (a, sa), (b, sb) = best
            pairs.append((a, b, _pair_score(rule, sa, sb)))
        for a, b, score in _rank_pairs(pairs, rule, _rng(seed, bucket, "pairs"))[:k]:
            step: Any = a.step if a.step == b.step else {"a": a.step, "b": b.step}
            picks.append(
                Pick(
                    a.key,
                    b.key,
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
    whether a pair shows its `b` as "A" (annotators favour the first response shown)."""
    shuffled = list(picks)
    _rng(seed, "order").shuffle(shuffled)
    swap_rng = _rng(seed, "swap")
    return [(pick, pick.b is not None and swap_rng.random() < 0.5) for pick in shuffled]
