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
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

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

REWARD_METRIC = "reward/mean"
SATURATION_WINDOW = 10
SATURATION_NEAR_BEST = 0.1
SATURATION_LENGTH_SHIFT = 0.5
SATURATION_EDGE_POINTS = 3

METRICS_USED: tuple[str, ...] = tuple(
    dict.fromkeys([*NONFINITE_METRICS, *KL_METRICS, ENTROPY_METRIC, LENGTH_METRIC, TRUNCATION_METRIC, REWARD_METRIC])
)
"""Every metric a rule reads: callers fetch just these series."""


@dataclass(frozen=True)
class Alert:
    code: str
    severity: Severity
    metric: str
    step: int
    message: str
    value: float | None = None


# --- helpers ---------------------------------------------------------------------------------


def _is_finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _finite_points(series: Series) -> list[Point]:
    steps, values = series
    return [(step, float(value)) for step, value in zip(steps, values) if _is_finite(value)]


def _early_level(points: Sequence[Point]) -> float | None:
    """Median of the first BASELINE_POINTS finite values; None while there are fewer (too early to judge)."""
    if len(points) < BASELINE_POINTS:
        return None
    return statistics.median(value for _, value in points[:BASELINE_POINTS])


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


def kl_blowup_alerts(series: Mapping[str, Series]) -> list[Alert]:
    """KL blowing up: above KL_BLOWUP_FACTOR (10×) its early level and above an absolute floor (critical).

    - `kl/mean`, the per-token KL to the reference model, starts at 0 (policy = reference) and grows
      slowly in a healthy run; InstructGPT-style PPO ends near 0.1 nat/token (10–25 nats per
      response). Above KL_FLOORS["kl/mean"] = 1 nat/token the policy has left the reference far
      behind, the usual prelude to reward hacking or gibberish; the KL coefficient (OpenRLHF
      `init_kl_coef`, verl `kl_loss_coef`) is too small or the learning rate too large.
    - `policy/approx_kl`, old vs. new policy within one update, is PPO's trust-region gauge:
      Spinning Up and Stable-Baselines stop an update at a target KL of 0.01–0.05. Persistently
      above KL_FLOORS["policy/approx_kl"] = 0.1 the clipped objective no longer bounds the step.

    The multiple of the early level keeps a run that legitimately starts high from alerting; the
    floor keeps a run that starts at ~0 from alerting on a harmless rise to 0.01.
    """
    alerts = []
    for name in KL_METRICS:
        if name not in series:
            continue
        points = _finite_points(series[name])
        early = _early_level(points)
        if early is None:
            continue
        limit = max(KL_BLOWUP_FACTOR * early, KL_FLOORS[name])
        hit = _first_persistent(points, lambda value: value > limit)
        if hit:
            step, value = hit
            alerts.append(
                Alert(
                    code="kl_blowup",
                    severity="critical",
                    metric=name,
                    step=step,
                    value=value,
                    message=f"{name} reached {_fmt(value)} at step {step} and stayed above {_fmt(limit)} "
                    f"(the larger of {KL_BLOWUP_FACTOR:g}× its early level {_fmt(early)} and {_fmt(KL_FLOORS[name])}) "
                    f"for {PERSIST_POINTS}+ steps: the policy is moving away too fast; raise the KL "
                    "coefficient or lower the learning rate.",
                )
            )
    return alerts


def entropy_collapse_alerts(series: Mapping[str, Series]) -> list[Alert]:
    """Entropy collapse: `policy/entropy` below ENTROPY_COLLAPSE_FRACTION (10%) of its early level (warning).

    Entropy falls during any RL fine-tuning, but a fall by an order of magnitude means the policy
    samples nearly one answer per prompt: GRPO groups become all-equal, advantages vanish and
    learning stalls (the "entropy collapse" that DAPO's clip-higher and Cui et al. 2025's
    entropy-mechanism work address). Remedies: clip-higher, an entropy bonus, a higher temperature.
    """
    if ENTROPY_METRIC not in series:
        return []
    points = _finite_points(series[ENTROPY_METRIC])
    early = _early_level(points)
    if early is None or early <= 0:
        return []
    limit = ENTROPY_COLLAPSE_FRACTION * early
    hit = _first_persistent(points, lambda value: value < limit)
    if not hit:
        return []
    step, value = hit
    return [
        Alert(
            code="entropy_collapse",
            severity="warning",
            metric=ENTROPY_METRIC,
            step=step,
            value=value,
            message=f"{ENTROPY_METRIC} fell to {_fmt(value)} at step {step}, below {ENTROPY_COLLAPSE_FRACTION:.0%} of "
            f"its early level {_fmt(early)} ({_fmt(limit)}), for {PERSIST_POINTS}+ steps: the policy is collapsing "
            "onto few answers; consider clip-higher, an entropy bonus or a higher temperature.",
        )
    ]


def entropy_blowup_alerts(series: Mapping[str, Series]) -> list[Alert]:
    """Entropy blow-up: `policy/entropy` above both ENTROPY_BLOWUP_FACTOR (3×) its early level and its
    early level + ENTROPY_BLOWUP_RISE (1 nat) (critical).

    Entropy drifts down in healthy RL fine-tuning; a jump to several times its early level means the
    policy is heading for uniform sampling over the vocabulary (ln V nats: 5.5 for 248 tokens, 11.9
    for Qwen's 152k), i.e. noise. The usual causes are an update that broke the weights (learning rate
    too high, a bad advantage scale), an entropy bonus that outweighs the reward, or a reward bug that
    pays for gibberish; the samples after it are not worth training on. The absolute rise keeps a
    policy that starts nearly deterministic (0.05 nat) from alerting on a harmless move to 0.2.
    """
    if ENTROPY_METRIC not in series:
        return []
    points = _finite_points(series[ENTROPY_METRIC])
    early = _early_level(points)
    if early is None:
        return []
    limit = max(ENTROPY_BLOWUP_FACTOR * early, early + ENTROPY_BLOWUP_RISE)
    hit = _first_persistent(points, lambda value: value > limit)
    if not hit:
        return []
    step, value = hit
    return [
        Alert(
            code="entropy_blowup",
            severity="critical",
            metric=ENTROPY_METRIC,
            step=step,
            value=value,
            message=f"{ENTROPY_METRIC} rose to {_fmt(value)} at step {step} and stayed above {_fmt(limit)} (the larger "
            f"of {ENTROPY_BLOWUP_FACTOR:g}× its early level {_fmt(early)} and that level + {ENTROPY_BLOWUP_RISE:g} nat) "
            f"for {PERSIST_POINTS}+ steps: the policy is drifting towards uniform noise; lower the learning rate, "
            "check the entropy bonus and whether the reward pays for gibberish.",
        )
    ]


def length_runaway_alerts(series: Mapping[str, Series]) -> list[Alert]:
    """Response length running away: `response/length_mean` over LENGTH_RUNAWAY_FACTOR (3×) its early level (warning).

    Longer answers can be real learning (R1-style reasoning grows), but a tripling is as often
    repetition loops or padding that a length-biased reward pays for (a known RLHF failure: reward
    models prefer long answers). It costs generation time quadratically and pushes answers into
    the token limit. Read samples before trusting the reward curve.
    """
    if LENGTH_METRIC not in series:
        return []
    points = _finite_points(series[LENGTH_METRIC])
    early = _early_level(points)
    if early is None or early <= 0:
        return []
    limit = LENGTH_RUNAWAY_FACTOR * early
    hit = _first_persistent(points, lambda value: value > limit)
    if not hit:
        return []
    step, value = hit
    return [
        Alert(
            code="length_runaway",
            severity="warning",
            metric=LENGTH_METRIC,
            step=step,
            value=value,
            message=f"{LENGTH_METRIC} reached {_fmt(value)} at step {step}, over {LENGTH_RUNAWAY_FACTOR:g}× its early "
            f"level {_fmt(early)}, for {PERSIST_POINTS}+ steps: check samples for repetition or padding.",
        )
    ]


def truncation_rising_alerts(series: Mapping[str, Series]) -> list[Alert]:
    """Truncation rising: `response/truncated_rate` at least TRUNCATION_LEVEL (20%) and at least
    TRUNCATION_RISE (10 points) above its early level (warning).

    A truncated response never reached EOS: its reward is usually 0 or a penalty, so a rising share
    of them drags the reward down and teaches the model that long is bad only by accident. DAPO
    shapes or filters overlong samples for this reason. Requiring a rise over the early level
    separates "the policy started rambling" from a run that was configured with a short
    max_new_tokens from the start (a config issue, visible in its first steps).
    """
    if TRUNCATION_METRIC not in series:
        return []
    points = _finite_points(series[TRUNCATION_METRIC])
    early = _early_level(points)
    if early is None:
        return []
    limit = max(TRUNCATION_LEVEL, early + TRUNCATION_RISE)
    hit = _first_persistent(points, lambda value: value >= limit)
    if not hit:
        return []
    step, value = hit
    return [
        Alert(
            code="truncation_rising",
            severity="warning",
            metric=TRUNCATION_METRIC,
            step=step,
            value=value,
            message=f"{TRUNCATION_METRIC} is {_fmt(value)} at step {step} (early level {_fmt(early)}), at least "
            f"{_fmt(limit)} for {PERSIST_POINTS}+ steps: responses run into max_new_tokens; raise the limit or "
            "check samples for rambling.",
        )
    ]


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
    kl_blowup_alerts,
    entropy_collapse_alerts,
    entropy_blowup_alerts,
    length_runaway_alerts,
    truncation_rising_alerts,
    reward_saturation_alerts,
)

_SEVERITY_ORDER = {"critical": 0, "warning": 1}


def diagnose(series: Mapping[str, Series]) -> list[Alert]:
    """Every rule's alerts, by step (critical first within a step)."""
    alerts = [alert for rule in RULES for alert in rule(series)]
    return sorted(alerts, key=lambda a: (a.step, _SEVERITY_ORDER[a.severity], a.code, a.metric))
