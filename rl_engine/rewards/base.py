"""Reward interface shared by every component, and the weighted composite the engine calls.

A component turns a :class:`RewardBatch` into one score per sample. It never raises for a
problem with a single sample (or with a remote server, or with user code): it returns 0.0 for
that sample and a reason in ``errors``. :class:`CompositeReward` adds the weighted scores,
collects the reasons as ``"component: reason"`` and still guards against a component that
raises anyway. A few failed samples degrade the signal; a component failing on most of a step's
samples fails the run (``rl_engine.rewards.loud``). A total that is not finite (a huge score times
its weight) is a per-sample error too, and each component's extra curves are bounded in number and
named safely, so user code cannot flood the run's metrics.

This module, like the whole package at import time, uses only the standard library: the
python sandbox child imports it, and it must not drag torch in.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

ExtraLogs = dict[str, "list[float] | float"]

# A reason can be a whole traceback line from user code; keep errors readable in the UI.
MAX_REASON_CHARS = 500
# Extra curves (`reward/<component>/<log>`) one component may add per step; names are kept metric-safe.
MAX_EXTRA_LOGS = 32
_LOG_NAME = re.compile(r"[A-Za-z0-9_.\-/]{1,64}")
# Where a non-finite weighted total is recorded among the components' errors (no component can be named so).
TOTAL = "<total>"


@dataclass(frozen=True)
class RewardBatch:
    prompts: list[str]  # prompt text as given to the model (after chat template if any)
    responses: list[str]  # generated text
    labels: list[str | None]  # ground truth from the dataset (may be None)
    queries: list[str]  # prompt+response concatenated (OpenRLHF calls these "queries")
    finish_reasons: list[str]  # "stop" | "length"
    metadata: list[dict]  # per-sample extra fields from the dataset row (data_source etc.)

    def __post_init__(self) -> None:
        n = len(self.prompts)
        for name in ("responses", "labels", "queries", "finish_reasons", "metadata"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"RewardBatch.{name} has {len(getattr(self, name))} items, prompts has {n}")

    def __len__(self) -> int:
        return len(self.prompts)

    @classmethod
    def build(
        cls,
        prompts: Sequence[str],
        responses: Sequence[str],
        labels: Sequence[str | None] | None = None,
        *,
        queries: Sequence[str] | None = None,
        finish_reasons: Sequence[str] | None = None,
        metadata: Sequence[dict] | None = None,
    ) -> RewardBatch:
        """Convenience constructor: queries default to prompt+response, the rest to neutral values."""
        n = len(prompts)
        return cls(
            prompts=list(prompts),
            responses=list(responses),
            labels=list(labels) if labels is not None else [None] * n,
            queries=list(queries) if queries is not None else [p + r for p, r in zip(prompts, responses)],
            finish_reasons=list(finish_reasons) if finish_reasons is not None else ["stop"] * n,
            metadata=[dict(m) for m in metadata] if metadata is not None else [{} for _ in range(n)],
        )


@dataclass
class ComponentResult:
    scores: list[float]  # one per sample; a failed sample gets 0.0 and an error
    errors: list[str | None]  # per-sample failure reason (None = ok)
    extra_logs: Mapping[str, list[float] | float] = field(default_factory=dict)  # extra curves (read only)

    @classmethod
    def failed(cls, n: int, reason: str) -> ComponentResult:
        """Every sample failed for the same reason (a batch-level failure)."""
        reason = truncate_reason(reason)
        return cls(scores=[0.0] * n, errors=[reason] * n, extra_logs={})

    @classmethod
    def ok(cls, scores: list[float], extra_logs: dict | None = None) -> ComponentResult:
        return cls(scores=list(scores), errors=[None] * len(scores), extra_logs=extra_logs or {})


@runtime_checkable
class RewardComponent(Protocol):
    name: str

    def score(self, batch: RewardBatch) -> ComponentResult: ...

    def close(self) -> None: ...


@dataclass
class RewardResult:
    total: list[float]  # weighted sum
    components: dict[str, list[float]]  # name -> per-sample score (unweighted)
    errors: list[list[str]]  # per-sample list of "component: reason"
    extra_logs: dict[str, float]  # "component/key" -> mean value
    timings: dict[str, float]  # component name -> seconds
    # component name (or TOTAL) -> per-sample reason (None = ok): what rl_engine.rewards.loud judges
    component_errors: dict[str, list[str | None]] = field(default_factory=dict)


class CompositeReward:
    """Weighted sum of components.

    - ``total[i] = sum(weight * score)`` over the components that scored sample ``i``; a
      component that failed on a sample contributes 0 there and its reason is recorded.
    - ``components`` holds the *unweighted* scores (0.0 where failed) so curves stay comparable
      when weights change. Weight 0 is allowed: a monitoring-only component.
    - A component that raises, or returns the wrong number of scores, fails the whole batch
      for that component only.
    - Components run one after the other; ``timings`` has the wall time of each.
    """

    def __init__(self, components: list[tuple[RewardComponent, float]]):
        if not components:
            raise ValueError("components: at least one reward component is required")
        seen: set[str] = set()
        for comp, weight in components:
            if comp.name in seen:
                raise ValueError(f"components: duplicate component name {comp.name!r}; give each a distinct name")
            seen.add(comp.name)
            if not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise ValueError(f"components: weight of {comp.name!r} must be a finite number, got {weight!r}")
        self.components = [(comp, float(weight)) for comp, weight in components]

    def score(self, batch: RewardBatch) -> RewardResult:
        n = len(batch)
        total = [0.0] * n
        per_component: dict[str, list[float]] = {}
        errors: list[list[str]] = [[] for _ in range(n)]
        extra_logs: dict[str, float] = {}
        timings: dict[str, float] = {}
        component_errors: dict[str, list[str | None]] = {}
        for comp, weight in self.components:
            started = time.perf_counter()
            try:
                result = comp.score(batch)
            except Exception as exc:  # a component must not take the run down with it
                result = ComponentResult.failed(n, f"{type(exc).__name__}: {exc}")
            timings[comp.name] = time.perf_counter() - started
            result = _checked(result, n)

            scores = []
            for i, (value, error) in enumerate(zip(result.scores, result.errors)):
                if error is not None:
                    errors[i].append(f"{comp.name}: {error}")
                    value = 0.0
                total[i] += weight * value
                scores.append(value)
            per_component[comp.name] = scores
            component_errors[comp.name] = list(result.errors)
            for key, logged in _bounded_logs(result.extra_logs).items():
                mean = mean_of(logged)
                if mean is not None:
                    extra_logs[f"{comp.name}/{key}"] = mean
        component_errors[TOTAL] = [None] * n
        for i, value in enumerate(total):
            if not math.isfinite(value):  # finite scores whose weighted sum overflowed
                total[i] = 0.0
                reason = "the weighted total of the components is not finite (a score too large for its weight)"
                errors[i].append(f"weighted total: {reason}")
                component_errors[TOTAL][i] = reason
        return RewardResult(total, per_component, errors, extra_logs, timings, component_errors)

    def close(self) -> None:
        """Close every component even if one fails to close; re-raise the first failure."""
        first: BaseException | None = None
        for comp, _ in self.components:
            try:
                comp.close()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    def __enter__(self) -> CompositeReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _checked(result: Any, n: int) -> ComponentResult:
    """Make a component's result safe to add up: right lengths, finite floats, reasons for 0s."""
    if not isinstance(result, ComponentResult):
        return ComponentResult.failed(n, f"component returned {type(result).__name__}, not ComponentResult")
    if len(result.scores) != n or len(result.errors) != n:
        return ComponentResult.failed(
            n, f"component returned {len(result.scores)} scores and {len(result.errors)} errors for {n} samples"
        )
    scores: list[float] = []
    errors: list[str | None] = []
    for value, error in zip(result.scores, result.errors):
        if error is None:
            try:
                value = to_score(value)
            except (TypeError, ValueError) as exc:
                error = str(exc)
        if error is not None:
            value = 0.0
        scores.append(value)
        errors.append(None if error is None else truncate_reason(str(error)))
    return ComponentResult(scores, errors, dict(result.extra_logs or {}))


def to_score(value: Any) -> float:
    """A finite float from a number (bool/int/float or a 0-d tensor-like); raises otherwise."""
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        value = value.item()
    if isinstance(value, (bool, int, float)):
        result = float(value)
    else:
        raise TypeError(f"score is not a number: {_short_repr(value)}")
    if not math.isfinite(result):
        raise ValueError(f"score is not finite: {result}")
    return result


def coerce_scores(raw: Any, n: int, what: str = "scores") -> tuple[list[float], list[str | None]]:
    """Validate a list of ``n`` per-sample numbers from user code or a server.

    A wrong length is a batch failure (raises ValueError with e.g. "returned 3 scores for 4
    samples"); a single bad value only fails its sample.
    """
    if hasattr(raw, "tolist") and not isinstance(raw, (list, tuple)):
        raw = raw.tolist()
    if not isinstance(raw, (list, tuple)):
        raise ValueError(f"returned {_type_name(raw)} instead of a list of {what}")
    if len(raw) != n:
        raise ValueError(f"returned {len(raw)} {what} for {n} samples")
    scores: list[float] = []
    errors: list[str | None] = []
    for value in raw:
        try:
            scores.append(to_score(value))
            errors.append(None)
        except (TypeError, ValueError) as exc:
            scores.append(0.0)
            errors.append(str(exc))
    return scores, errors


def coerce_extra_logs(raw: Any) -> dict[str, list[float] | float]:
    """Keep the numeric entries of an ``extra_logs`` mapping (scalars or lists of numbers).

    Non-numeric entries are dropped rather than failing the samples: they are diagnostics,
    not rewards.
    """
    if not isinstance(raw, dict):
        return {}
    out: dict[str, list[float] | float] = {}
    for key, value in raw.items():
        if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
            value = value.tolist()
        if isinstance(value, (list, tuple)):
            numbers = [float(v) for v in value if isinstance(v, (int, float))]
            if numbers:
                out[str(key)] = numbers
        elif isinstance(value, (int, float)):
            out[str(key)] = float(value)
    return out


def parse_openrlhf_output(value: Any, n: int, what: str = "scores") -> ComponentResult:
    """Scores and curves from an OpenRLHF-shaped output (reward function or remote server).

    Accepts a bare list (or tensor) of rewards, ``{"rewards": [...]}``, ``{"scores": [...]}`` or
    the full ``{"rewards", "scores", "extra_logs"}``. ``rewards`` wins when both are present and
    ``scores`` is then logged as an extra curve. Raises ValueError for a wrong shape.
    """
    extra: dict = {}
    if isinstance(value, dict):
        if "rewards" in value:
            raw = value["rewards"]
            if "scores" in value:
                extra["scores"] = value["scores"]
        elif "scores" in value:
            raw = value["scores"]
        else:
            raise ValueError(f"returned a dict without 'rewards' or 'scores' (keys: {sorted(map(str, value))[:8]})")
        if isinstance(value.get("extra_logs"), dict):
            extra.update(value["extra_logs"])
    else:
        raw = value
    scores, errors = coerce_scores(raw, n, what)
    return ComponentResult(scores, errors, coerce_extra_logs(extra))


def _bounded_logs(logs: Mapping[str, list[float] | float]) -> dict[str, list[float] | float]:
    """The first MAX_EXTRA_LOGS extra logs whose names are metric-safe (the rest are dropped: a curve per
    sample, or a name the event store refuses, would flood or break the run's metrics)."""
    kept: dict[str, list[float] | float] = {}
    for key, value in logs.items():
        if len(kept) >= MAX_EXTRA_LOGS:
            break
        if isinstance(key, str) and _LOG_NAME.fullmatch(key) and "//" not in key and not key.startswith("/"):
            kept[key] = value
    return kept


def mean_of(value: list[float] | float) -> float | None:
    """Mean of the finite values (a scalar is its own mean); None when there is nothing to log."""
    values = value if isinstance(value, (list, tuple)) else [value]
    finite = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def truncate_reason(reason: str) -> str:
    return reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 3] + "..."


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"
