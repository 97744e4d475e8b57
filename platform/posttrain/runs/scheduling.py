"""The scheduler's rules, as plain functions over plain values (no database, no Ray): what a run
needs, whether it fits, the order of the queue (priority with aging, then dominant-resource fairness
between users, then age), quotas and the reason a run waits. posttrain.runs.services.scheduler applies
them under a lock; docs/ARCHITECTURE.md, "The scheduler", tells the whole story."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from posttrain.runs.models import PRIORITY_RANK, Run, RunPriority

RESOURCE_KEYS = ("CPU", "GPU")
Resources = dict[str, float]


def run_resources(run: Run) -> dict:
    """The run's stored resource needs; a run launched before they were stored reads them from its config."""
    if run.resources:
        return run.resources
    from rl_engine.config import ConfigError, validate_config
    from rl_engine.distributed.placement import resource_needs

    try:
        return resource_needs(validate_config(run.resolved_config))
    except ConfigError:  # a config this engine build no longer reads: it holds nothing we can count
        return {"driver": {"CPU": 0.0, "GPU": 0.0}, "bundles": [], "total": {"CPU": 0.0, "GPU": 0.0}}


def total_of(run: Run) -> Resources:
    total = run_resources(run)["total"]
    return {key: float(total.get(key, 0.0)) for key in RESOURCE_KEYS}


def add(a: Mapping[str, float], b: Mapping[str, float]) -> Resources:
    return {key: a.get(key, 0.0) + b.get(key, 0.0) for key in RESOURCE_KEYS}


def subtract(a: Mapping[str, float], b: Mapping[str, float]) -> Resources:
    return {key: a.get(key, 0.0) - b.get(key, 0.0) for key in RESOURCE_KEYS}


def fits(need: Mapping[str, float], free: Mapping[str, float]) -> bool:
    # A hair of slack: Ray's fractional resources come back as floats (0.1 + 0.2).
    return all(need.get(key, 0.0) <= free.get(key, 0.0) + 1e-9 for key in RESOURCE_KEYS)


def dominant_share(used: Mapping[str, float], cluster_total: Mapping[str, float]) -> float:
    """Dominant-resource fairness (Ghodsi et al., NSDI 2011): a user's largest share of any resource."""
    shares = [used.get(key, 0.0) / cluster_total[key] for key in RESOURCE_KEYS if cluster_total.get(key, 0.0) > 0]
    return max(shares, default=0.0)


def effective_priority(priority: str, waited_s: float, aging_s: float) -> int:
    """The priority level a waiting run is ordered by: its own, plus one level per `aging_s` waited."""
    aged = int(waited_s // aging_s) if aging_s > 0 else 0
    return PRIORITY_RANK[RunPriority(priority)] + max(0, aged)


def amount(value: float, key: str) -> str:
    """`1 CPU`, `2 CPUs`, `0.5 GPUs`."""
    return f"{value:g} {key}{'' if math.isclose(value, 1.0) else 's'}"


def describe(resources: Mapping[str, float]) -> str:
    """`2 CPUs`, `1 CPU, 1 GPU`: what a person reads in a reason."""
    return ", ".join(
        amount(resources.get(key, 0.0), key) for key in RESOURCE_KEYS if resources.get(key, 0.0) or key == "CPU"
    )


@dataclass(frozen=True)
class ClusterNode:
    node_id: str
    address: str
    total: Resources
    free: Resources
    head: bool = False


@dataclass(frozen=True)
class ClusterView:
    """The Ray cluster as its own report shows it (workers/ray_cluster.py)."""

    nodes: list[ClusterNode]

    @property
    def total(self) -> Resources:
        return {key: sum(n.total.get(key, 0.0) for n in self.nodes) for key in RESOURCE_KEYS}

    @property
    def free(self) -> Resources:
        return {key: sum(n.free.get(key, 0.0) for n in self.nodes) for key in RESOURCE_KEYS}

    def as_dict(self) -> dict:
        return {
            "nodes": [
                {"node_id": n.node_id, "address": n.address, "head": n.head, "total": n.total, "free": n.free}
                for n in self.nodes
            ],
            "total": self.total,
            "free": self.free,
        }


@dataclass(frozen=True)
class Limits:
    """A user's tightest quota (None: no limit)."""

    max_runs: int | None = None
    max_cpus: float | None = None
    max_gpus: float | None = None


@dataclass(frozen=True)
class Candidate:
    """A waiting run as the scheduler sees it."""

    run_id: str
    owner: str  # the user's id as text; "" for a run whose user is gone
    priority: str
    waiting_since: datetime
    created_at: datetime
    need: Resources


@dataclass
class Usage:
    """What one user's runs hold now."""

    runs: int = 0
    held: Resources = field(default_factory=lambda: {key: 0.0 for key in RESOURCE_KEYS})

    def plus(self, need: Mapping[str, float]) -> Usage:
        return Usage(self.runs + 1, add(self.held, need))


def _order_key(c: Candidate, usage: Mapping[str, Usage], cluster_total: Mapping[str, float], now, aging_s):
    held = usage.get(c.owner, Usage()).held
    waited = (now - c.waiting_since).total_seconds()
    return (-effective_priority(c.priority, waited, aging_s), dominant_share(held, cluster_total), c.created_at)


def quota_refusal(limits: Limits, used: Usage, need: Mapping[str, float]) -> str | None:
    """Why admitting a run of `need` would put its user over quota, or None."""
    if limits.max_runs is not None and used.runs + 1 > limits.max_runs:
        return f"over your quota of {limits.max_runs} concurrent run{'s' if limits.max_runs != 1 else ''}"
    if limits.max_cpus is not None and used.held["CPU"] + need.get("CPU", 0.0) > limits.max_cpus + 1e-9:
        return f"over your quota of {limits.max_cpus:g} CPUs ({used.held['CPU']:g} in use)"
    if limits.max_gpus is not None and used.held["GPU"] + need.get("GPU", 0.0) > limits.max_gpus + 1e-9:
        return f"over your quota of {limits.max_gpus:g} GPUs ({used.held['GPU']:g} in use)"
    return None


def over_quota_alone(need: Mapping[str, float], limits: Limits) -> str | None:
    """Why the run alone exceeds its user's quota (it can never start, however long it waits), or None."""
    if limits.max_runs == 0:
        return "your quota allows no runs"
    if limits.max_cpus is not None and need.get("CPU", 0.0) > limits.max_cpus + 1e-9:
        return f"needs {amount(need['CPU'], 'CPU')}, more than your quota of {limits.max_cpus:g}"
    if limits.max_gpus is not None and need.get("GPU", 0.0) > limits.max_gpus + 1e-9:
        return f"needs {amount(need['GPU'], 'GPU')}, more than your quota of {limits.max_gpus:g}"
    return None


def too_large_for_cluster(pieces: Iterable[Mapping[str, float]], nodes: Iterable[Mapping[str, float]]) -> str | None:
    """Why the cluster can never hold the run: a piece that must sit on one node (the driver, or one
    bundle of its placement group) larger than every node's total, or None."""
    nodes = list(nodes)
    for piece in pieces:
        if not any(fits(piece, node) for node in nodes):
            largest = max(nodes, key=lambda n: (n.get("GPU", 0.0), n.get("CPU", 0.0)), default={})
            return (
                f"needs {describe(piece)} in one place; the cluster's largest node has {describe(largest)}: "
                "lower placement.cpus_per_* / gpus_per_*, or add a node"
            )
    return None


@dataclass(frozen=True)
class Decision:
    run_id: str
    admit: bool
    reason: str  # why it waits, or what it was granted
    blocking: bool = False  # the first run in order that did not fit: it holds everyone behind it


def admission_plan(
    waiting: Iterable[Candidate],
    free: Mapping[str, float],
    usage: Mapping[str, Usage],
    limits: Mapping[str, Limits],
    cluster_total: Mapping[str, float],
    now: datetime,
    aging_s: float,
) -> list[Decision]:
    """The queue in admission order, each run admitted now or told why it waits.

    Order: higher (aged) priority first, then the user whose runs hold the smaller dominant share of
    the cluster, then the older run; shares count each admission as it is made, so one user's many
    runs interleave with everyone else's. A run held by its quota is passed over; the first run that
    does not fit stops admission (no later, smaller run overtakes it, so it cannot starve)."""
    remaining = list(waiting)
    free = dict(free)
    usage = {owner: Usage(u.runs, dict(u.held)) for owner, u in usage.items()}
    decisions: list[Decision] = []
    blocked = False
    waiting_ahead = 0
    while remaining:
        candidate = min(remaining, key=lambda c: _order_key(c, usage, cluster_total, now, aging_s))
        remaining.remove(candidate)
        used = usage.get(candidate.owner, Usage())
        refusal = quota_refusal(limits.get(candidate.owner, Limits()), used, candidate.need)
        if refusal:
            decisions.append(Decision(candidate.run_id, False, refusal))
            continue
        if not blocked and fits(candidate.need, free):
            free = subtract(free, candidate.need)
            usage[candidate.owner] = used.plus(candidate.need)
            decisions.append(Decision(candidate.run_id, True, f"granted {describe(candidate.need)}"))
            continue
        blocked = True
        short = [key for key in RESOURCE_KEYS if candidate.need.get(key, 0.0) > free.get(key, 0.0) + 1e-9]
        shortage = "; ".join(
            f"needs {amount(candidate.need[k], k)}, {max(0.0, free.get(k, 0.0)):g} free" for k in short
        )
        ahead = f"{waiting_ahead} run{'s' if waiting_ahead != 1 else ''} ahead" if waiting_ahead else ""
        decisions.append(
            Decision(
                candidate.run_id,
                False,
                "; ".join(p for p in (shortage, ahead) if p) or "waits its turn",
                blocking=not waiting_ahead,
            )
        )
        waiting_ahead += 1
    return decisions


@dataclass(frozen=True)
class Holder:
    """A running run as preemption sees it."""

    run_id: str
    priority: str
    created_at: datetime
    held: Resources
    preemptible: bool


def preemption_victims(
    blocked: Candidate, free: Mapping[str, float], running: Iterable[Holder], coming_free: Mapping[str, float]
) -> list[str]:
    """Which running runs to preempt so that `blocked` (the run at the head of the queue that does not
    fit) can start: preemptible runs of a strictly lower priority, the lowest priority first and within it
    the youngest (the least work stands to wait), only as many as it takes. None when runs already being
    preempted (`coming_free`) will make room, or when even every eligible run would not."""
    available = add(free, coming_free)
    if fits(blocked.need, available):
        return []
    rank = PRIORITY_RANK[RunPriority(blocked.priority)]
    eligible = [h for h in running if h.preemptible and PRIORITY_RANK[RunPriority(h.priority)] < rank]
    eligible.sort(key=lambda h: (PRIORITY_RANK[RunPriority(h.priority)], -h.created_at.timestamp()))
    victims: list[str] = []
    for holder in eligible:
        victims.append(holder.run_id)
        available = add(available, holder.held)
        if fits(blocked.need, available):
            return victims
    return []
