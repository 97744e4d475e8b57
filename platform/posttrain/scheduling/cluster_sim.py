"""A simulated cluster that drives the scheduler's own decisions (posttrain.scheduling.rules.admission_plan)
over a trace of runs, without Ray or a database: the property tests and bench/queue_trace.py use it to
see the scheduler at a scale this machine cannot run (64 GPUs, 1,000 runs).

Time is event-driven: at every arrival and every end the pass runs, and each run it admits starts at once
on the nodes it was placed on and ends after its true length. Its expected length is what the trace
declares (`expected_s`; the true one unless the trace says otherwise)."""

from __future__ import annotations

import heapq
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from posttrain.scheduling.backfill import Allocation
from posttrain.scheduling.rules import (
    RESOURCE_KEYS,
    Candidate,
    Decision,
    FairShare,
    Holder,
    Plan,
    Resources,
    Usage,
    add,
    admission_plan,
    preemption_victims,
    subtract,
)

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
PRIORITIES = ("low", "normal", "high")


@dataclass(frozen=True)
class TraceRun:
    run_id: str
    arrival_s: float
    length_s: float
    need: Resources
    priority: str = "normal"
    owner: str = "u0"
    expected_s: float | None = None  # what the scheduler is told (None: the true length)
    pieces: tuple[Resources, ...] = ()


@dataclass
class Outcome:
    run: TraceRun
    start_s: float | None = None
    end_s: float | None = None
    placement: Allocation = field(default_factory=dict)
    left_s: float = 0.0  # what is left of its length (all of it until it first starts)
    preemptions: int = 0

    def __post_init__(self) -> None:
        self.left_s = self.run.length_s


@dataclass
class SimResult:
    outcomes: dict[str, Outcome]
    pass_seconds: list[tuple[int, float]]  # (waiting runs, seconds the pass took)
    capacity: Resources

    def figures(self, key: str = "GPU") -> dict[str, float | None]:
        """Utilisation of the `key` resource over the makespan, mean completion time, p95 slowdown."""
        done = [o for o in self.outcomes.values() if o.end_s is not None and o.start_s is not None]
        if not done:
            return {"utilisation": None, "mean_completion_s": None, "p95_slowdown": None, "makespan_s": None}
        first = min(o.run.arrival_s for o in done)
        makespan = max(o.end_s for o in done if o.end_s is not None) - first
        busy = sum(o.run.need.get(key, 0.0) * o.run.length_s for o in done)
        slowdowns = sorted((o.end_s - o.run.arrival_s) / o.run.length_s for o in done if o.end_s is not None)
        return {
            "utilisation": round(busy / (self.capacity.get(key, 0.0) * makespan), 4) if makespan > 0 else None,
            "mean_completion_s": round(statistics.fmean(o.end_s - o.run.arrival_s for o in done), 2),  # type: ignore[operator]
            "p95_slowdown": round(slowdowns[min(len(slowdowns) - 1, math.ceil(0.95 * len(slowdowns)) - 1)], 3),
            "makespan_s": round(makespan, 2),
        }


def simulate(
    trace: list[TraceRun],
    nodes: dict[str, Resources],
    *,
    backfill: bool = True,
    preemption: bool = False,
    aging_s: float = 0.0,
    check=None,
) -> SimResult:
    """Replay `trace` on `nodes`; `check(now_s, waiting, running, decisions, plan)` sees every pass (tests).
    With `preemption`, the head of the queue preempts lower-priority runs as the platform does
    (preemption_victims); a preempted run leaves at once with its work kept (a checkpoint at its step
    boundary) and waits again for what is left of its length."""
    capacity = {key: sum(n.get(key, 0.0) for n in nodes.values()) for key in RESOURCE_KEYS}
    free = {name: dict(r) for name, r in nodes.items()}
    outcomes = {r.run_id: Outcome(r) for r in trace}
    events: list[tuple[float, int, str, str]] = [(r.arrival_s, 1, "arrive", r.run_id) for r in trace]
    heapq.heapify(events)
    waiting: dict[str, TraceRun] = {}
    running: dict[str, Outcome] = {}
    timings: list[tuple[int, float]] = []
    while events:
        now_s = events[0][0]
        _take_instant(events, now_s, outcomes, waiting, running, free)
        if not waiting:
            continue
        now = EPOCH + timedelta(seconds=now_s)
        candidates = [candidate(r, outcomes[r.run_id].left_s) for r in waiting.values()]
        ends: list[tuple[float | None, Allocation]] = [
            (_expected_left(o, now_s), o.placement) for o in running.values()
        ]
        plan = Plan({name: dict(r) for name, r in free.items()}, capacity, ends)
        usage = _usage_by_owner(running)
        started = time.perf_counter()
        decisions = admission_plan(candidates, plan, usage, {}, now, aging_s, fair=FairShare(), backfill=backfill)
        timings.append((len(candidates), time.perf_counter() - started))
        if check is not None:
            check(now_s, dict(waiting), dict(running), decisions, plan)
        _start_admitted(decisions, outcomes, waiting, running, free, events, now_s)
        head = next((d for d in decisions if d.blocking), None)
        if preemption and head is not None:
            for victim in _preempt(head, candidates, running, free, now_s):
                waiting[victim] = outcomes[victim].run
                heapq.heappush(events, (now_s, 2, "arrive-again", victim))  # one more pass at this instant
    return SimResult(outcomes, timings, capacity)


def _take_instant(
    events: list[tuple[float, int, str, str]],
    now_s: float,
    outcomes: dict[str, Outcome],
    waiting: dict[str, TraceRun],
    running: dict[str, Outcome],
    free: dict[str, Resources],
) -> None:
    """Pop every event of the instant `now_s`: arrivals join the waiting runs, ends free their nodes."""
    while events and events[0][0] == now_s:  # every event of this instant, then one pass
        _, _, kind, run_id = heapq.heappop(events)
        if kind == "arrive":
            waiting[run_id] = outcomes[run_id].run
        elif run_id in running and running[run_id].end_s == now_s:  # not an end left by a preemption
            ended = running.pop(run_id)
            for name, resources in ended.placement.items():
                free[name] = add(free[name], resources)


def _usage_by_owner(running: dict[str, Outcome]) -> dict[str, Usage]:
    """What each owner's running runs hold."""
    usage: dict[str, Usage] = {}
    for o in running.values():
        usage[o.run.owner] = usage.get(o.run.owner, Usage()).plus(o.run.need)
    return usage


def _start_admitted(
    decisions: list[Decision],
    outcomes: dict[str, Outcome],
    waiting: dict[str, TraceRun],
    running: dict[str, Outcome],
    free: dict[str, Resources],
    events: list[tuple[float, int, str, str]],
    now_s: float,
) -> None:
    """Start each admitted run now, moving it from waiting to running, and queue its end."""
    for decision in decisions:
        if not decision.admit:
            continue
        end_s = _start(outcomes[decision.run_id], decision.placement or {}, free, now_s)
        running[decision.run_id] = outcomes[decision.run_id]
        del waiting[decision.run_id]
        heapq.heappush(events, (end_s, 0, "end", decision.run_id))


def _start(outcome: Outcome, placement: Allocation, free: dict[str, Resources], now_s: float) -> float:
    """An admitted run takes its room on the nodes; returns when it ends. AssertionError when that
    over-commits a node."""
    if outcome.start_s is None:
        outcome.start_s = now_s
    outcome.placement = placement
    end_s = outcome.end_s = now_s + outcome.left_s
    for name, resources in placement.items():
        free[name] = subtract(free[name], resources)
        if any(free[name][key] < -1e-9 for key in RESOURCE_KEYS):
            raise AssertionError(f"{outcome.run.run_id} over-committed node {name}: {free[name]}")
    return end_s


def _preempt(head, candidates, running: dict[str, Outcome], free: dict[str, Resources], now_s: float) -> list[str]:
    """The platform's preemption for the run at the head of the queue; the victims leave at once."""
    blocked = next(c for c in candidates if c.run_id == head.run_id)
    holders = [
        Holder(o.run.run_id, o.run.priority, EPOCH + timedelta(seconds=o.start_s or 0.0), o.run.need, True, o.placement)
        for o in running.values()
    ]
    victims = preemption_victims(blocked, free, holders, {})
    for run_id in victims:
        outcome = running.pop(run_id)
        outcome.left_s = max(0.0, (outcome.end_s or now_s) - now_s)
        outcome.preemptions += 1
        for name, resources in outcome.placement.items():
            free[name] = add(free[name], resources)
    return victims


def candidate(run: TraceRun, left_s: float) -> Candidate:
    """A waiting trace run as the scheduler sees it, `left_s` of its true length still to run."""
    arrived = EPOCH + timedelta(seconds=run.arrival_s)
    expected = left_s * (1.0 if run.expected_s is None else run.expected_s / run.length_s)
    return Candidate(
        run.run_id, run.owner, run.priority, arrived, arrived, run.need, pieces=run.pieces, duration_s=expected
    )


def _expected_left(outcome: Outcome, now_s: float) -> float:
    """What the scheduler expects of a running run: its declared length, less what it has run."""
    run = outcome.run
    expected = run.length_s if run.expected_s is None else run.expected_s
    return max(0.0, (outcome.end_s or now_s) - run.length_s + expected - now_s)


def mixed_trace(
    runs: int,
    *,
    seed: int = 0,
    sizes: tuple[float, ...] = (1, 2, 4, 8),
    key: str = "GPU",
    shortest_s: float = 600.0,
    mean_gap_s: float = 120.0,
    owners: int = 4,
) -> list[TraceRun]:
    """A mixed job trace: sizes from `sizes` (of `key`), lengths 1-8x the shortest, low/normal/high
    priorities, Poisson arrivals with `mean_gap_s` between them, `owners` users."""
    rng = random.Random(seed)
    trace = []
    at = 0.0
    for i in range(runs):
        size = rng.choice(sizes)
        need = {"CPU": size if key == "CPU" else 0.0, "GPU": size if key == "GPU" else 0.0}
        trace.append(
            TraceRun(
                f"r{i:04d}",
                round(at, 3),
                shortest_s * rng.randint(1, 8),
                need,
                priority=rng.choices(PRIORITIES, weights=(3, 5, 2))[0],
                owner=f"u{rng.randrange(owners)}",
            )
        )
        at += rng.expovariate(1.0 / mean_gap_s)
    return trace


def gpu_cluster(nodes: int = 8, gpus_per_node: int = 8, cpus_per_node: int = 64) -> dict[str, Resources]:
    return {f"node{i}": {"CPU": float(cpus_per_node), "GPU": float(gpus_per_node)} for i in range(nodes)}
