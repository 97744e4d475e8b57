"""RL diagnostics: alerts a PPO/GRPO practitioner would raise when reading a run's curves.

Pure functions over metric series `{name: (steps, values)}` (steps ascending, as the engine logged
them). A `None` value is a point the engine reported as NaN/Inf (the selectors turn the stored
"nan"/"inf" strings into None); float NaN/Inf are treated the same. Missing points are simply
absent from the series.

Every rule is causal: it compares a point with the run's own early level (the median of its first
few finite points) or with what came before, never with the future, so an alert's `step` stays put
as the run goes on and a live page does not see alerts move. Rules on noisy curves require the
condition to hold for `PERSIST_POINTS` consecutive finite points; the alert's step is the first of
them. Each rule raises at most one alert per metric: the first occurrence, which is where to look.

Most rules are of one kind, "past a limit set by the metric's early level, for PERSIST_POINTS points":
those are the rows of LEVEL_RULES, all judged by `level_alerts`, so a new rule of that kind is one row.
NaN/Inf, failing rewards and reward saturation have rules of their own.
"""

from __future__ import annotations

import math
import operator
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeGuard

from rl_engine.spec.catalogues import require

Severity = Literal["warning", "critical"]
Series = tuple[Sequence[int], Sequence[float | None]]
Point = tuple[int, float]

# --- thresholds ------------------------------------------------------------------------------

BASELINE_POINTS = 5
"""The early level of a metric is the median of its first 5 finite points: one odd first step (a
cold cache, a lucky batch) cannot move a median of five, and five steps is still "early" in any run."""

PERSIST_POINTS = 3
"""Batch-level RL metrics are noisy (one batch of a few hundred samples); a condition must hold for
3 consecutive points before it is an alert, so a single spike is not one."""

NONFINITE_METRICS = (
    "policy/loss",
    "critic/loss",
    "kl/mean",
    "policy/approx_kl",
    "policy/grad_norm",
    "critic/grad_norm",
)

KL_METRICS = ("kl/mean", "policy/approx_kl")
KL_BLOWUP_FACTOR = 10.0
KL_FLOORS: Mapping[str, float] = {"kl/mean": 1.0, "policy/approx_kl": 0.1}

ENTROPY_METRIC = "policy/entropy"
ENTROPY_COLLAPSE_FRACTION = 0.1
ENTROPY_BLOWUP_FACTOR = 3.0
ENTROPY_BLOWUP_RISE = 1.0

LENGTH_METRIC = "response/length_mean"
LENGTH_RUNAWAY_FACTOR = 3.0

TRUNCATION_METRIC = "response/truncated_rate"
TRUNCATION_LEVEL = 0.2
TRUNCATION_RISE = 0.1

MISMATCH_KL_METRIC = "rollout_corr/k3_kl"
MISMATCH_KL_FACTOR = 5.0
MISMATCH_KL_FLOOR = 1e-3

REWARD_METRIC = "reward/mean"
REWARD_ERRORS_METRIC = "reward/errors"
SATURATION_WINDOW = 10
SATURATION_NEAR_BEST = 0.1
SATURATION_LENGTH_SHIFT = 0.5
SATURATION_EDGE_POINTS = 3

METRICS_USED: tuple[str, ...] = tuple(
    require(name)
    for name in dict.fromkeys(
        [
            *NONFINITE_METRICS,
            *KL_METRICS,
            ENTROPY_METRIC,
            LENGTH_METRIC,
            TRUNCATION_METRIC,
            MISMATCH_KL_METRIC,
            REWARD_METRIC,
            REWARD_ERRORS_METRIC,
        ]
    )
)
"""Every metric a rule reads: callers fetch just these series. Each is one the metric catalogue
describes (rl_engine/metric_catalogue.py): a metric renamed there fails here, at import."""


@dataclass(frozen=True)
class Alert:
    code: str
    severity: Severity
    metric: str
    step: int
    message: str
    value: float | None = None
    # Which rollouts of `step` show the problem (a rule of posttrain.runs.hacking_examples; None: no
    # particular ones), and the indices of those picked (filled in by the selectors, which read rollouts).
    examples_rule: str | None = None
    examples: tuple[int, ...] | None = None


# --- helpers ---------------------------------------------------------------------------------


def _is_finite(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _finite_points(series: Series) -> list[Point]:
    steps, values = series
    return [(step, float(value)) for step, value in zip(steps, values) if _is_finite(value)]


def _early_level(points: Sequence[Point]) -> float | None:
    """Median of the first BASELINE_POINTS finite values; None while there are fewer (too early to judge)."""
    if len(points) < BASELINE_POINTS:
        return None
    return statistics.median(value for _, value in points[:BASELINE_POINTS])


def _past_limit(past: Callable[[float, float], bool], limit: float) -> Callable[[float], bool]:
    """One rule's condition "the value is past `limit`", bound to this limit."""
    return lambda value: past(value, limit)


def _first_persistent(points: Iterable[Point], condition: Callable[[float], bool]) -> Point | None:
    """The first point of the first PERSIST_POINTS consecutive points meeting `condition`."""
    start: Point | None = None
    streak = 0
    for point in points:
        if not condition(point[1]):
            streak = 0
            continue
        if streak == 0:
            start = point
        streak += 1
        if streak >= PERSIST_POINTS:
            return start
    return None


def _fmt(value: float) -> str:
    return f"{value:.4g}"


# --- rules -----------------------------------------------------------------------------------


def nonfinite_alerts(series: Mapping[str, Series]) -> list[Alert]:
    """NaN/Inf in a loss, a KL or a gradient norm (critical, from a single point).

    One non-finite loss or gradient means the optimizer step that followed wrote NaN/Inf into the
    weights (unless the step was skipped, as fp16 loss scaling does): every later point of the run
    is suspect. DeepSpeed and TRL log the same quantities for exactly this check; there is no noise
    to wait out, so one point is enough. Usual causes: a learning rate too high, bf16/fp16 overflow
    in the logprob ratio, a reward or advantage that is itself NaN.
    """
    alerts = []
    for name in NONFINITE_METRICS:
        if name not in series:
            continue
        steps, values = series[name]
        bad_steps = [step for step, value in zip(steps, values) if not _is_finite(value)]
        if bad_steps:
            alerts.append(
                Alert(
                    code="nonfinite",
                    severity="critical",
                    metric=name,
                    step=bad_steps[0],
                    message=f"{name} is NaN or Inf at step {bad_steps[0]} ({len(bad_steps)} non-finite "
                    f"point{'s' if len(bad_steps) != 1 else ''} in all): the update diverged, weights after it "
                    "cannot be trusted; lower the learning rate or check rewards and precision.",
                )
            )
    return alerts


def reward_error_alerts(series: Mapping[str, Series]) -> list[Alert]:
    """Samples whose reward failed (critical, from a single point).

    A failed sample scores 0 with its reason recorded, so a reward that breaks (user code that raises, a
    server that is down, a score that overflows) does not show on the reward curve as an error: it shows as a
    run that learns nothing, or learns to please the zeros. The engine fails the run when a component fails
    on most of a step's samples (rewards[].max_error_rate); any failure below that is this alert, at the first
    step that had one, so nobody trains on a silently broken reward. The samples' errors say why.
    """
    if REWARD_ERRORS_METRIC not in series:
        return []
    steps, values = series[REWARD_ERRORS_METRIC]
    failed = [(step, float(value)) for step, value in zip(steps, values) if _is_finite(value) and value > 0]
    if not failed:
        return []
    step, count = failed[0]
    total = sum(value for _, value in failed)
    return [
        Alert(
            code="reward_errors",
            severity="critical",
            metric=REWARD_ERRORS_METRIC,
            step=step,
            value=count,
            message=f"{_fmt(count)} sample(s) of step {step} scored 0 because a reward failed ({_fmt(total)} over "
            f"{len(failed)} step{'s' if len(failed) != 1 else ''} so far): read the samples' errors; a reward that "
            "fails on more than its max_error_rate of a step's samples fails the run.",
        )
    ]


@dataclass(frozen=True)
class Crossing:
    """Where a level rule fired, its numbers formatted for the message."""

    metric: str
    step: int
    value: str
    early: str
    limit: str


@dataclass(frozen=True)
class LevelRule:
    """An alert when `metric` goes past a limit set by its own early level and stays past it for
    PERSIST_POINTS consecutive finite points; the alert's step is the first of them."""

    code: str
    severity: Severity
    metric: str
    limit: Callable[[float], float | None]  # the early level -> the limit; None: nothing to judge against
    past: Callable[[float, float], bool]  # (value, limit) -> the value is past the limit
    message: Callable[[Crossing], str]
    examples_rule: str | None = None  # the alert's `examples_rule`


def _kl_blowup(metric: str) -> LevelRule:
    floor = KL_FLOORS[metric]
    return LevelRule(
        "kl_blowup",
        "critical",
        metric,
        limit=lambda early: max(KL_BLOWUP_FACTOR * early, floor),
        past=operator.gt,
        message=lambda c: (
            f"{c.metric} reached {c.value} at step {c.step} and stayed above {c.limit} "
            f"(the larger of {KL_BLOWUP_FACTOR:g}× its early level {c.early} and {_fmt(floor)}) "
            f"for {PERSIST_POINTS}+ steps: the policy is moving away too fast; raise the KL "
            "coefficient or lower the learning rate."
        ),
    )


def _only_positive(limit: Callable[[float], float]) -> Callable[[float], float | None]:
    """A limit relative to an early level that must be positive to mean anything (a length, an entropy)."""
    return lambda early: limit(early) if early > 0 else None


LEVEL_RULES: tuple[LevelRule, ...] = (
    # KL blowing up: above KL_BLOWUP_FACTOR (10×) its early level and above an absolute floor (critical).
    # - `kl/mean`, the per-token KL to the reference model, starts at 0 (policy = reference) and grows
    #   slowly in a healthy run; InstructGPT-style PPO ends near 0.1 nat/token (10–25 nats per
    #   response). Above KL_FLOORS["kl/mean"] = 1 nat/token the policy has left the reference far
    #   behind, the usual prelude to reward hacking or gibberish; the KL coefficient (OpenRLHF
    #   `init_kl_coef`, verl `kl_loss_coef`) is too small or the learning rate too large.
    # - `policy/approx_kl`, old vs. new policy within one update, is PPO's trust-region gauge:
    #   Spinning Up and Stable-Baselines stop an update at a target KL of 0.01–0.05. Persistently
    #   above KL_FLOORS["policy/approx_kl"] = 0.1 the clipped objective no longer bounds the step.
    # The multiple of the early level keeps a run that legitimately starts high from alerting; the
    # floor keeps a run that starts at ~0 from alerting on a harmless rise to 0.01.
    *(_kl_blowup(metric) for metric in KL_METRICS),
    # Entropy collapse: below ENTROPY_COLLAPSE_FRACTION (10%) of its early level (warning). Entropy
    # falls during any RL fine-tuning, but a fall by an order of magnitude means the policy samples
    # nearly one answer per prompt: GRPO groups become all-equal, advantages vanish and learning
    # stalls (the "entropy collapse" that DAPO's clip-higher and Cui et al. 2025's entropy-mechanism
    # work address). Remedies: clip-higher, an entropy bonus, a higher temperature.
    LevelRule(
        "entropy_collapse",
        "warning",
        ENTROPY_METRIC,
        limit=_only_positive(lambda early: ENTROPY_COLLAPSE_FRACTION * early),
        past=operator.lt,
        message=lambda c: (
            f"{c.metric} fell to {c.value} at step {c.step}, below {ENTROPY_COLLAPSE_FRACTION:.0%} of "
            f"its early level {c.early} ({c.limit}), for {PERSIST_POINTS}+ steps: the policy is collapsing "
            "onto few answers; consider clip-higher, an entropy bonus or a higher temperature."
        ),
    ),
    # Entropy blow-up: above both ENTROPY_BLOWUP_FACTOR (3×) its early level and that level +
    # ENTROPY_BLOWUP_RISE (1 nat) (critical). Entropy drifts down in healthy RL fine-tuning; a jump to
    # several times its early level means the policy is heading for uniform sampling over the vocabulary
    # (ln V nats: 5.5 for 248 tokens, 11.9 for Qwen's 152k), i.e. noise. Usual causes: an update that broke
    # the weights (learning rate too high, a bad advantage scale), an entropy bonus that outweighs the
    # reward, a reward bug that pays for gibberish; the samples after it are not worth training on. The
    # absolute rise keeps a policy that starts nearly deterministic (0.05 nat) from alerting on a move to 0.2.
    LevelRule(
        "entropy_blowup",
        "critical",
        ENTROPY_METRIC,
        limit=lambda early: max(ENTROPY_BLOWUP_FACTOR * early, early + ENTROPY_BLOWUP_RISE),
        past=operator.gt,
        message=lambda c: (
            f"{c.metric} rose to {c.value} at step {c.step} and stayed above {c.limit} (the larger of "
            f"{ENTROPY_BLOWUP_FACTOR:g}× its early level {c.early} and that level + {ENTROPY_BLOWUP_RISE:g} nat) "
            f"for {PERSIST_POINTS}+ steps: the policy is drifting towards uniform noise; lower the learning rate, "
            "check the entropy bonus and whether the reward pays for gibberish."
        ),
    ),
    # Response length running away: over LENGTH_RUNAWAY_FACTOR (3×) its early level (warning). Longer
    # answers can be real learning (R1-style reasoning grows), but a tripling is as often repetition
    # loops or padding that a length-biased reward pays for (a known RLHF failure: reward models
    # prefer long answers). It costs generation time quadratically and pushes answers into the token
    # limit. Read samples before trusting the reward curve.
    LevelRule(
        "length_runaway",
        "warning",
        LENGTH_METRIC,
        limit=_only_positive(lambda early: LENGTH_RUNAWAY_FACTOR * early),
        past=operator.gt,
        message=lambda c: (
            f"{c.metric} reached {c.value} at step {c.step}, over {LENGTH_RUNAWAY_FACTOR:g}× its early "
            f"level {c.early}, for {PERSIST_POINTS}+ steps: check samples for repetition or padding."
        ),
    ),
    # Truncation rising: at least TRUNCATION_LEVEL (20%) and at least TRUNCATION_RISE (10 points)
    # above its early level (warning). A truncated response never reached EOS: its reward is usually 0
    # or a penalty, so a rising share of them drags the reward down and teaches the model that long is
    # bad only by accident. DAPO shapes or filters overlong samples for this reason. Requiring a rise
    # over the early level separates "the policy started rambling" from a run that was configured
    # with a short max_new_tokens from the start (a config issue, visible in its first steps).
    LevelRule(
        "truncation_rising",
        "warning",
        TRUNCATION_METRIC,
        limit=lambda early: max(TRUNCATION_LEVEL, early + TRUNCATION_RISE),
        past=operator.ge,
        message=lambda c: (
            f"{c.metric} is {c.value} at step {c.step} (early level {c.early}), at least "
            f"{c.limit} for {PERSIST_POINTS}+ steps: responses run into max_new_tokens; raise the limit or "
            "check samples for rambling."
        ),
    ),
    # Rollout/trainer mismatch leaving its early range: the k3 KL between the policy that sampled
    # (the rollout engine, possibly several updates behind in async mode) and the trainer's above both
    # MISMATCH_KL_FACTOR (5x) its early level and MISMATCH_KL_FLOOR (1e-3 nat/token) (warning). A run's
    # mismatch is set early by its numerics (bf16 engine vs fp32 trainer) and its staleness, and stays
    # there while training is stable; prime-rl and Yao et al. 2025 watch its rise as the early-warning
    # sign of off-policy collapse, which follows within tens of steps unless the importance weights are
    # truncated or masked. The floor keeps a run that starts at ~0 (same weights, same numerics) from
    # alerting on a harmless rise to 1e-4.
    LevelRule(
        "mismatch_kl_rising",
        "warning",
        MISMATCH_KL_METRIC,
        limit=lambda early: max(MISMATCH_KL_FACTOR * early, MISMATCH_KL_FLOOR),
        past=operator.gt,
        message=lambda c: (
            f"{c.metric} (rollout vs trainer) reached {c.value} at step {c.step} and stayed above {c.limit} "
            f"(the larger of {MISMATCH_KL_FACTOR:g}× its early level {c.early} and {_fmt(MISMATCH_KL_FLOOR)}) "
            f"for {PERSIST_POINTS}+ steps: the samples' policy is drifting from the trainer's, the early sign "
            "of off-policy collapse; lower backends.max_staleness or the learning rate, or truncate/mask "
            "the importance weights (algorithm.rollout_correction)."
        ),
    ),
)


def level_alerts(series: Mapping[str, Series], rules: Sequence[LevelRule] = LEVEL_RULES) -> list[Alert]:
    """The alerts of the level rules: for each rule whose metric is logged, its first crossing."""
    alerts = []
    for rule in rules:
        if rule.metric not in series:
            continue
        points = _finite_points(series[rule.metric])
        early = _early_level(points)
        if early is None:
            continue
        limit = rule.limit(early)
        if limit is None:
            continue
        hit = _first_persistent(points, _past_limit(rule.past, limit))
        if hit:
            step, value = hit
            crossing = Crossing(rule.metric, step, _fmt(value), _fmt(early), _fmt(limit))
            message = rule.message(crossing)
            alerts.append(Alert(rule.code, rule.severity, rule.metric, step, message, value, rule.examples_rule))
    return alerts


def reward_saturation_alerts(series: Mapping[str, Series]) -> list[Alert]:
    """Reward saturated while length shifts: a reward-hacking smell (warning).

    Over SATURATION_WINDOW (10) consecutive steps where both are logged, every `reward/mean` is within
    SATURATION_NEAR_BEST (10%) of the run's reward range from its best so far, while
    `response/length_mean` moves by at least SATURATION_LENGTH_SHIFT (50%) between the window's first
    and last SATURATION_EDGE_POINTS (3) points (medians, so one odd batch does not count). When the
    reward can no longer go up, a policy that still changes how much it writes is optimising
    something the reward does not measure: padding a reward model likes, or answers cut to a bare
    format that a rule-based reward accepts. The alert's step is the end of the first such window.
    A reward that never moved (range 0) does not count: that is a dead reward, not a saturated one.
    """
    if REWARD_METRIC not in series or LENGTH_METRIC not in series:
        return []
    lengths = dict(_finite_points(series[LENGTH_METRIC]))
    paired = [
        (step, reward, lengths[step]) for step, reward in _finite_points(series[REWARD_METRIC]) if step in lengths
    ]
    best = worst = None
    for end, (step, reward, _) in enumerate(paired):
        best = reward if best is None else max(best, reward)
        worst = reward if worst is None else min(worst, reward)
        if end + 1 < SATURATION_WINDOW or best <= worst:
            continue
        window = paired[end + 1 - SATURATION_WINDOW : end + 1]
        near_best = best - SATURATION_NEAR_BEST * (best - worst)
        if min(r for _, r, _ in window) < near_best:
            continue
        before = statistics.median(length for _, _, length in window[:SATURATION_EDGE_POINTS])
        after = statistics.median(length for _, _, length in window[-SATURATION_EDGE_POINTS:])
        if before <= 0 or abs(after - before) / before < SATURATION_LENGTH_SHIFT:
            continue
        return [
            Alert(
                code="reward_saturation_length_shift",
                severity="warning",
                metric=REWARD_METRIC,
                step=step,
                value=reward,
                message=f"{REWARD_METRIC} stayed within {_fmt(best - near_best)} of its best {_fmt(best)} over steps "
                f"{window[0][0]}–{step} while {LENGTH_METRIC} went from {_fmt(before)} to {_fmt(after)} "
                f"({(after - before) / before:+.0%}): a reward-hacking smell; read the samples of these steps.",
            )
        ]
    return []


RULES: tuple[Callable[[Mapping[str, Series]], list[Alert]], ...] = (
    nonfinite_alerts,
    reward_error_alerts,
    level_alerts,
    reward_saturation_alerts,
)

_SEVERITY_ORDER = {"critical": 0, "warning": 1}


def ordered(alerts: Iterable[Alert]) -> list[Alert]:
    """Alerts by step, critical first within a step."""
    return sorted(alerts, key=lambda a: (a.step, _SEVERITY_ORDER[a.severity], a.code, a.metric))


def diagnose(series: Mapping[str, Series]) -> list[Alert]:
    """Every rule's alerts, by step (critical first within a step). The reward-hacking signals are in
    posttrain.runs.hacking (`posttrain.telemetry.alerts.run_alerts` gives both)."""
    return ordered(alert for rule in RULES for alert in rule(series))
