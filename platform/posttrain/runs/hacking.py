"""Reward-hacking signals: alerts that a run is learning to game its reward rather than its task.

Pure functions over metric series, like `posttrain.runs.diagnostics` (same `Series`, same `Alert`, same
causal rules: a signal's step never moves as the run goes on). What they read is the engine's: the reward
and its components, the held-out evaluation, the responses' statistics (`rl_engine.response_stats`) and the
length. The lesson of rewardspy and of the hacker-fixer studies is that a reward's *dynamics* against a
held-out measure tell hacking from learning, and that dominance alone gives false alarms: every signal here
compares a rise with something that should have risen with it and did not.

Each alert names an `examples` rule: which rollouts of its step show it (`posttrain.runs.hacking_examples`
picks them from the stored rollouts). Thresholds, what each catches and its test: docs/REWARD_HACKING.md.
"""

from __future__ import annotations

import math
import operator
import statistics
from collections.abc import Callable, Mapping, Sequence

from posttrain.runs.diagnostics import (
    PERSIST_POINTS,
    REWARD_METRIC,
    Alert,
    LevelRule,
    Point,
    Series,
    _finite_points,
    _fmt,
    level_alerts,
)
from rl_engine.spec.catalogues import RESERVED_REWARD_NAMES, require

LENGTH_METRIC = require("response/length_mean")
EVAL_REWARD_METRIC = require("eval/reward/mean")
REPETITION_METRIC = require("response/repetition_rate")
NONPRINTABLE_METRIC = require("response/nonprintable_share")
COMPRESSION_METRIC = require("response/compression_ratio")
ZERO_ADVANTAGE_METRIC = require("reward/group_all_equal_rate")
TOP_ANSWER_METRIC = require("response/top_answer_group_share")

# --- thresholds ------------------------------------------------------------------------------

WINDOW = 10
"""Training-reward changes are judged over 10 steps: long enough that a batch's noise averages out in the
medians of its ends, short enough to flag a hack within 20 steps of its start."""

EDGE_POINTS = 3
"""A window's start and end levels are medians of its first and last 3 points, so one odd batch at either
end cannot make or break a change."""

RISE_MIN = 0.05
"""A reward (or a component) "rises" over a window when its end level exceeds its start level by at least
5% of the larger of their magnitudes, and by 0.02 at least: rewards live on [0, 1] or similar scales, where
a 0.02 move over 10 batches of a few hundred samples is within noise."""

RISE_FLOOR = 0.02

FALL_MIN = RISE_MIN
"""A component "falls" by the same measure, downwards."""

EVAL_DROP_FRACTION = 0.1
"""Held-out reward or accuracy has "fallen" when it is 10% below its best so far (0.02 at least): held-out
accuracy on a few hundred prompts is noisy by about 3.5 points, so a smaller drop is not evidence."""

EVAL_DROP_FLOOR = 0.02

EVAL_CONFIRM_POINTS = 2
"""The held-out drop must hold at 2 consecutive evaluations: one bad evaluation is noise."""

LENGTH_RISE_FRACTION = 0.2
"""Length "rises" over a window when its end level is 20% above its start level."""

LENGTH_CORRELATION = 0.6
"""The reward must follow length over the window: Pearson correlation of the two per-step means at least 0.6."""

REPETITION_RISE = 0.2
NONPRINTABLE_RISE = 0.05
COMPRESSION_RISE_FACTOR = 1.5
COMPRESSION_LOOP_RATIO = 2.4  # Whisper's threshold: its decoder treats a more compressible output as a loop
ZERO_ADVANTAGE_RISE = 0.25
TOP_ANSWER_RISE = 0.3
TOP_ANSWER_LEVEL = 0.5

# --- helpers ---------------------------------------------------------------------------------


def _rises(before: float, after: float, fraction: float = RISE_MIN, floor: float = RISE_FLOOR) -> bool:
    return after - before >= max(floor, fraction * max(abs(before), abs(after)))


def _falls(before: float, after: float) -> bool:
    return before - after >= max(RISE_FLOOR, FALL_MIN * max(abs(before), abs(after)))


def _edges(values: Sequence[float]) -> tuple[float, float]:
    """The window's start and end levels: medians of its first and last EDGE_POINTS values."""
    return statistics.median(values[:EDGE_POINTS]), statistics.median(values[-EDGE_POINTS:])


def _aligned(series: Mapping[str, Series], names: Sequence[str]) -> list[tuple[int, list[float]]]:
    """The steps where every one of `names` has a finite point, with their values in `names`' order."""
    columns = [dict(_finite_points(series[name])) for name in names]
    steps = sorted(set(columns[0]).intersection(*columns[1:]))
    return [(step, [column[step] for column in columns]) for step in steps]


def _windows(rows: list[tuple[int, list[float]]]) -> list[tuple[int, list[list[float]]]]:
    """Each window of WINDOW consecutive aligned steps: (its last step, its values per metric)."""
    out = []
    for end in range(WINDOW, len(rows) + 1):
        chunk = rows[end - WINDOW : end]
        out.append((chunk[-1][0], [list(column) for column in zip(*(values for _, values in chunk))]))
    return out


def _first_streak(hits: Sequence[tuple[int, bool]], length: int = PERSIST_POINTS) -> int | None:
    """The first step of the first `length` consecutive hits."""
    streak: list[int] = []
    for step, hit in hits:
        streak = [*streak, step] if hit else []
        if len(streak) >= length:
            return streak[0]
    return None


def _components(series: Mapping[str, Series], prefix: str) -> list[str]:
    """The per-component reward metrics under `prefix` ("reward/" or "eval/reward/"), the engine's own
    reward curves (mean, std, errors, ...) left out."""
    names = []
    for name in sorted(series):
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix) :]
        if "/" not in rest and rest not in RESERVED_REWARD_NAMES:
            names.append(name)
    return names


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:  # a constant series: no correlation to speak of
        return 0.0


# --- signals ---------------------------------------------------------------------------------


def divergence_alerts(series: Mapping[str, Series]) -> list[Alert]:
    """Training reward rising while held-out reward or accuracy falls (critical).

    For each held-out metric (`eval/reward/mean` and every `eval/reward/<component>`, e.g. an exact-match
    component kept at weight 0 to measure accuracy): at an evaluation where it is below its best so far by
    EVAL_DROP_FRACTION (10%, 0.02 at least) for EVAL_CONFIRM_POINTS (2) consecutive evaluations, while the
    training reward (`reward/mean`, the median of its last EDGE_POINTS points up to the evaluation) has risen
    above its level at the held-out best. The policy is getting better at what the reward pays for and worse
    at the task: the definition of reward hacking, and the most expensive failure of RL post-training. The
    alert's step is the first evaluation of the confirmed drop; its examples are that step's best-paid rollouts.
    """
    if REWARD_METRIC not in series:
        return []
    train = _finite_points(series[REWARD_METRIC])
    alerts = []
    for name in [EVAL_REWARD_METRIC, *_components(series, "eval/reward/")]:
        if name not in series:
            continue
        hit = _divergence(train, _finite_points(series[name]))
        if hit is None:
            continue
        step, best_step, best, value, before, after = hit
        component = name.removeprefix("eval/reward/")
        alerts.append(
            Alert(
                code="train_heldout_divergence",
                severity="critical",
                metric=name,
                step=step,
                value=value,
                message=f"{name} fell to {_fmt(value)} at step {step} from its best {_fmt(best)} (step {best_step}) "
                f"and stayed down at the next evaluation, while {REWARD_METRIC} rose from {_fmt(before)} to "
                f"{_fmt(after)}: the policy is learning what the reward pays for, not the task. Read the best-paid "
                "rollouts of this step; probe the reward (its page, Probe).",
                examples_rule="top_reward" if name == EVAL_REWARD_METRIC else f"top_reward_low:{component}",
            )
        )
    return alerts


def _level_before(points: Sequence[Point], step: int) -> float | None:
    """The median of the last EDGE_POINTS points at or before `step`."""
    upto = [value for s, value in points if s <= step][-EDGE_POINTS:]
    return statistics.median(upto) if upto else None


def _divergence(
    train: Sequence[Point], held_out: Sequence[Point]
) -> tuple[int, int, float, float, float, float] | None:
    """(first step of the confirmed drop, the best's step, the best, the value there, the training reward's
    level at the best, at the drop), or None."""
    if not held_out:
        return None
    best_step, best = held_out[0]
    streak: list[tuple[int, float, float, float]] = []
    for step, value in held_out[1:]:
        if value > best:
            best_step, best, streak = step, value, []
            continue
        dropped = best - value >= max(EVAL_DROP_FLOOR, EVAL_DROP_FRACTION * abs(best))
        before, after = _level_before(train, best_step), _level_before(train, step)
        if dropped and before is not None and after is not None and _rises(before, after):
            streak.append((step, value, before, after))
        else:
            streak = []
        if len(streak) >= EVAL_CONFIRM_POINTS:
            first_step, first_value, start, end = streak[0]
            return first_step, best_step, best, first_value, start, end
    return None


def length_alerts(series: Mapping[str, Series]) -> list[Alert]:
    """Reward rising with response length at fixed correctness (warning).

    Over a WINDOW (10) of steps: `reward/mean` rises (RISE_MIN), `response/length_mean` rises by
    LENGTH_RISE_FRACTION (20%), the two per-step means correlate at LENGTH_CORRELATION (0.6) or more, and a
    measure of correctness stays flat: a reward component that does not rise over the same window (e.g. an
    exact-match component, even at weight 0). Length a reward pays for at equal correctness is the classic
    reward-model bias (longer looks better) and the easiest hack of a length-scaled reward. Needs at least
    one component that is not rising; for PERSIST_POINTS consecutive windows. The alert's step is the end
    of the first window; its examples are the step's longest well-paid rollouts.
    """
    components = _components(series, "reward/")
    if REWARD_METRIC not in series or LENGTH_METRIC not in series or not components:
        return []
    names = [REWARD_METRIC, LENGTH_METRIC, *components]
    hits = []
    details: dict[int, tuple[float, float, float, float, str]] = {}
    for end, (reward, length, *parts) in _windows(_aligned(series, names)):
        r0, r1 = _edges(reward)
        l0, l1 = _edges(length)
        flat = [name for name, values in zip(components, parts) if not _rises(*_edges(values))]
        hit = (
            _rises(r0, r1)
            and l0 > 0
            and (l1 - l0) / l0 >= LENGTH_RISE_FRACTION
            and _pearson(reward, length) >= LENGTH_CORRELATION
            and bool(flat)
        )
        hits.append((end, hit))
        if hit:
            details[end] = (r0, r1, l0, l1, ", ".join(flat))
    step = _first_streak(hits)
    if step is None:
        return []
    r0, r1, l0, l1, flat_names = details[step]
    return [
        Alert(
            code="reward_with_length",
            severity="warning",
            metric=REWARD_METRIC,
            step=step,
            value=r1,
            message=f"Over the {WINDOW} steps to step {step}, {REWARD_METRIC} rose from {_fmt(r0)} to {_fmt(r1)} "
            f"following {LENGTH_METRIC} ({_fmt(l0)} to {_fmt(l1)}) while {flat_names} stayed flat: the reward pays for "
            "length, not correctness. Read the longest well-paid rollouts; penalise length or fix the reward.",
            examples_rule="longest_well_paid",
        )
    ]


def component_alerts(series: Mapping[str, Series]) -> list[Alert]:
    """One component carrying the total's change while the others fall (warning).

    Over a WINDOW (10) of steps: `reward/mean` rises, exactly one component rises and every other component
    falls (FALL_MIN), for PERSIST_POINTS consecutive windows. A component that can be maxed alone (a format
    bonus, a length term, a judge's taste) pulls the total up while the policy gets worse at everything else
    the reward asks for. One component growing faster than others is ordinary learning (rewardspy's dominance
    warning fires on it); the others falling is the sign. Needs two components or more. Examples: the step's
    rollouts where that component most exceeds the others.
    """
    components = _components(series, "reward/")
    if REWARD_METRIC not in series or len(components) < 2:
        return []
    hits = []
    details: dict[int, tuple[str, float, float, list[str]]] = {}
    for end, (reward, *parts) in _windows(_aligned(series, [REWARD_METRIC, *components])):
        levels = [_edges(values) for values in parts]
        rising = [name for name, (a, b) in zip(components, levels) if _rises(a, b)]
        falling = [name for name, (a, b) in zip(components, levels) if _falls(a, b)]
        hit = _rises(*_edges(reward)) and len(rising) == 1 and len(falling) == len(components) - 1
        hits.append((end, hit))
        if hit:
            a, b = levels[components.index(rising[0])]
            details[end] = (rising[0], a, b, falling)
    step = _first_streak(hits)
    if step is None:
        return []
    name, a, b, falling = details[step]
    component = name.removeprefix("reward/")
    return [
        Alert(
            code="component_carries_reward",
            severity="warning",
            metric=name,
            step=step,
            value=b,
            message=f"Over the {WINDOW} steps to step {step}, {name} rose from {_fmt(a)} to {_fmt(b)} and carried "
            f"{REWARD_METRIC} up while every other component fell ({', '.join(falling)}): the policy is maxing one "
            "part of the reward at the expense of the rest. Read the rollouts where it dominates; lower its "
            "weight or cap it.",
            examples_rule=f"component_over_others:{component}",
        )
    ]


LevelLimit = Callable[[float], float]  # a rule's early level -> its limit (inf: nothing it could exceed)


def _rule(code: str, metric: str, limit: LevelLimit, what: str, advice: str, examples_rule: str) -> LevelRule:
    return LevelRule(
        code,
        "warning",
        metric,
        limit=limit,
        past=operator.gt,
        message=lambda c: (
            f"{c.metric} reached {c.value} at step {c.step} and stayed above {c.limit} (early level {c.early}) "
            f"for {PERSIST_POINTS}+ steps: {what}. {advice}"
        ),
        examples_rule=examples_rule,
    )


HACKING_LEVEL_RULES: tuple[LevelRule, ...] = (
    # Repetition: above the larger of early + REPETITION_RISE (0.2) and twice the early level. A policy paid
    # for length, for keywords anywhere or for a judge's taste learns to loop: the share of a response's
    # 4-grams that repeat an earlier one climbs from near 0 (prose) towards 1 (one phrase looped).
    _rule(
        "repetition_rising",
        REPETITION_METRIC,
        lambda early: max(early + REPETITION_RISE, 2 * early),
        "responses are looping",
        "Read the most repetitive rollouts; the repetition filter (rollout.filters.repetition) keeps them out of "
        "the update.",
        "most_repetitive",
    ),
    # Non-text: above the larger of early + NONPRINTABLE_RISE (0.05) and twice the early level. Control
    # characters and broken bytes in the output are gibberish a lenient reward (a substring match, a judge
    # that ignores noise) still pays for.
    _rule(
        "gibberish_rising",
        NONPRINTABLE_METRIC,
        lambda early: max(early + NONPRINTABLE_RISE, 2 * early),
        "responses are turning into non-text",
        "Read them; the gibberish filter (rollout.filters.gibberish) keeps them out of the update.",
        "most_nonprintable",
    ),
    # Compressibility: above the larger of COMPRESSION_RISE_FACTOR (1.5x) its early level and
    # COMPRESSION_LOOP_RATIO (2.4, where Whisper's decoder calls its output a loop).
    _rule(
        "compression_rising",
        COMPRESSION_METRIC,
        lambda early: max(COMPRESSION_RISE_FACTOR * early, COMPRESSION_LOOP_RATIO),
        "responses are getting far more compressible, i.e. repetitive",
        "Read the most compressible rollouts.",
        "most_compressible",
    ),
    # Zero-advantage groups: above early + ZERO_ADVANTAGE_RISE (0.25). Either the task is being solved
    # (every sample right: check the held-out accuracy) or the policy found one answer the reward always
    # pays (or never pays) whatever the prompt: the learning signal is gone either way.
    _rule(
        "zero_advantage_rising",
        ZERO_ADVANTAGE_METRIC,
        lambda early: early + ZERO_ADVANTAGE_RISE if early + ZERO_ADVANTAGE_RISE < 1 else math.inf,
        "more and more prompt groups score all alike and carry no learning signal",
        "If held-out accuracy is not rising with it, the reward pays one answer whatever it says.",
        "tied_groups",
    ),
    # A format-only pattern: the share of prompts that got the step's most common answer above the larger of
    # early + TOP_ANSWER_RISE (0.3) and TOP_ANSWER_LEVEL (0.5). One same answer spreading over different
    # prompts is a policy that stopped reading them: an empty tag pair, a fixed phrase, a boxed nothing that
    # the reward's format check pays.
    _rule(
        "format_only_pattern",
        TOP_ANSWER_METRIC,
        lambda early: max(early + TOP_ANSWER_RISE, TOP_ANSWER_LEVEL) if early + TOP_ANSWER_RISE < 1 else math.inf,
        "one same answer is spreading over different prompts (a prompt-independent, format-only pattern)",
        "Read the rollouts that give it; check that the reward looks past the format.",
        "top_answer",
    ),
)


def hacking_alerts(series: Mapping[str, Series]) -> list[Alert]:
    """Every hacking signal's alerts (unsorted; `diagnostics.ordered` sorts them with the others)."""
    return [
        *divergence_alerts(series),
        *length_alerts(series),
        *component_alerts(series),
        *level_alerts(series, HACKING_LEVEL_RULES),
    ]


def metrics_used(names: Sequence[str]) -> list[str]:
    """Of a run's metric names (every metric it logged), those the signals read."""
    fixed = {REWARD_METRIC, EVAL_REWARD_METRIC, LENGTH_METRIC, *(rule.metric for rule in HACKING_LEVEL_RULES)}
    logged: dict[str, Series] = dict.fromkeys(names, ([], []))
    return sorted({*fixed.intersection(names), *_components(logged, "reward/"), *_components(logged, "eval/reward/")})
