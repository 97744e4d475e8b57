"""The scheduler's rules, as plain functions over plain values (no database, no Ray): what a run
needs, the order of the queue (priority with aging, then fair share over time between teams and users,
then age), quotas, the plan of one admission pass (placement on nodes and backfill, posttrain.scheduling.backfill),
preemption, and the reason a run waits. posttrain.scheduling.services applies them under a lock;
docs/ARCHITECTURE.md, "The scheduler", tells the whole story."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from posttrain.runs.models import PRIORITY_RANK, RunPriority

# A run's resource needs and their wording live with runs (the run page shows them); the scheduler's modules and the
# worker read them here, with the rules they feed.
from posttrain.runs.resources import RESOURCE_KEYS, Resources, amount, describe
from posttrain.runs.resources import run_resources as run_resources
from posttrain.runs.resources import total_of as total_of
from posttrain.scheduling.backfill import Allocation, Timeline, largest_room, pack


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
    """One account's tightest quota (None: no limit): a user's (their own and their groups'), or a project's."""

    max_runs: int | None = None
    max_cpus: float | None = None
    max_gpus: float | None = None


def project_account(project: str) -> str:
    """The key of a project's quota and usage, beside the users' (their ids) in the same mappings."""
    return f"project:{project}"


# A team is what fair share and lending count a run against beyond its user: a project or a group with a quota.
# Its key says which, since a group and a project may share a name.
GROUP_TEAM, PROJECT_TEAM = "group", "project"


def team_key(kind: str, name: str) -> str:
    return f"{kind}:{name}"


def team_kind_and_name(key: str) -> tuple[str, str]:
    """("group", "lab-a") of "group:lab-a"; the name keeps any colon of its own."""
    kind, _, name = key.partition(":")
    return kind, name


@dataclass(frozen=True)
class Candidate:
    """A waiting run as the scheduler sees it."""

    run_id: str
    owner: str  # the user's id as text; "" for a run whose user is gone
    priority: str
    waiting_since: datetime
    created_at: datetime
    need: Resources
    # What must each sit on one node: the driver and each bundle (default: the whole need in one piece).
    pieces: tuple[Resources, ...] = ()
    duration_s: float | None = None  # its expected length (None: unknown, so it never ends as far as we know)
    team: str = ""  # the team (team_key) it counts against for fair share and lending; "" for none
    project: str = ""  # its project's name: it is held to the project's quota too ("" for none)

    @property
    def parts(self) -> tuple[Resources, ...]:
        return self.pieces or (self.need,)

    @property
    def quota_accounts(self) -> tuple[tuple[str, str], ...]:
        """The quotas the run is held to: (the key of their limits and usage, whose quota a reason names)."""
        mine = ((self.owner, "your"),)
        return (*mine, (project_account(self.project), f"project {self.project}'s")) if self.project else mine


@dataclass
class Usage:
    """What one account's runs hold now: a user's, or a project's (project_account)."""

    runs: int = 0
    held: Resources = field(default_factory=lambda: {key: 0.0 for key in RESOURCE_KEYS})

    def plus(self, need: Mapping[str, float]) -> Usage:
        return Usage(self.runs + 1, add(self.held, need))


# An admission counts at once as this many seconds of the run's share of the cluster, so that within one
# pass one user's runs interleave with everyone else's (Kueue's entry penalty) instead of all going first.
ENTRY_PENALTY_S = 300.0


@dataclass
class FairShare:
    """Fair share over time (Slurm's decayed usage, Kueue's admission fair sharing): each user's and each
    team's usage, in share-seconds of the cluster decayed with a half-life (`decayed_usage`), over its
    weight. Between runs of equal priority the team with the smaller ratio goes first, then within it the
    user with the smaller one. A run of no team is its user's team of one. Teams are keyed by team_key."""

    user_usage: dict[str, float] = field(default_factory=dict)
    team_usage: dict[str, float] = field(default_factory=dict)
    user_weight: dict[str, float] = field(default_factory=dict)
    team_weight: dict[str, float] = field(default_factory=dict)

    def key(self, c: Candidate) -> tuple[float, float]:
        user = self.user_usage.get(c.owner, 0.0) / self.user_weight.get(c.owner, 1.0)
        team = self.team_usage.get(c.team, 0.0) / self.team_weight.get(c.team, 1.0) if c.team else user
        return (team, user)

    def charge(self, c: Candidate, cluster_total: Mapping[str, float]) -> None:
        cost = dominant_share(c.need, cluster_total) * ENTRY_PENALTY_S
        self.user_usage[c.owner] = self.user_usage.get(c.owner, 0.0) + cost
        if c.team:
            self.team_usage[c.team] = self.team_usage.get(c.team, 0.0) + cost


def decayed_usage(share: float, start_s: float, end_s: float, half_life_s: float) -> float:
    """Share-seconds of holding `share` of the cluster from `start_s` to `end_s` seconds ago, each second
    weighted 2^(-age / half-life): the integral of share * 2^(-t/H) for t from end_s to start_s."""
    if start_s <= end_s:
        return 0.0
    if half_life_s <= 0:
        return share * (start_s - end_s)
    rate = math.log(2) / half_life_s
    return share * (math.exp(-rate * end_s) - math.exp(-rate * start_s)) / rate


def _order_key(c: Candidate, level: int, fair: FairShare):
    return (-level, *fair.key(c), c.created_at)


def quota_refusal(limits: Limits, used: Usage, need: Mapping[str, float], whose: str = "your") -> str | None:
    """Why admitting a run of `need` would put the account (`whose` quota: "your", "project alpha's") over its
    quota, or None."""
    if limits.max_runs is not None and used.runs + 1 > limits.max_runs:
        return f"over {whose} quota of {limits.max_runs} concurrent run{'s' if limits.max_runs != 1 else ''}"
    if limits.max_cpus is not None and used.held["CPU"] + need.get("CPU", 0.0) > limits.max_cpus + 1e-9:
        return f"over {whose} quota of {limits.max_cpus:g} CPUs ({used.held['CPU']:g} in use)"
    if limits.max_gpus is not None and used.held["GPU"] + need.get("GPU", 0.0) > limits.max_gpus + 1e-9:
        return f"over {whose} quota of {limits.max_gpus:g} GPUs ({used.held['GPU']:g} in use)"
    return None


def quotas_refusal(c: Candidate, limits: Mapping[str, Limits], usage: Mapping[str, Usage]) -> str | None:
    """Why admitting the run would put its user or its project over quota, or None."""
    for key, whose in c.quota_accounts:
        refusal = quota_refusal(limits.get(key, Limits()), usage.get(key, Usage()), c.need, whose)
        if refusal:
            return refusal
    return None


def over_quota_alone(need: Mapping[str, float], limits: Limits, whose: str = "your") -> str | None:
    """Why the run alone exceeds a quota (it can never start, however long it waits), or None."""
    if limits.max_runs == 0:
        return f"{whose} quota allows no runs"
    if limits.max_cpus is not None and need.get("CPU", 0.0) > limits.max_cpus + 1e-9:
        return f"needs {amount(need['CPU'], 'CPU')}, more than {whose} quota of {limits.max_cpus:g}"
    if limits.max_gpus is not None and need.get("GPU", 0.0) > limits.max_gpus + 1e-9:
        return f"needs {amount(need['GPU'], 'GPU')}, more than {whose} quota of {limits.max_gpus:g}"
    return None


def over_quotas_alone(c: Candidate, limits: Mapping[str, Limits]) -> str | None:
    """Why the run alone exceeds its user's or its project's quota, or None."""
    for key, whose in c.quota_accounts:
        reason = over_quota_alone(c.need, limits.get(key, Limits()), whose)
        if reason:
            return reason
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
    blocking: bool = False  # the first run in order that did not start: preemption may make room for it
    expected_start_s: float | None = None  # seconds from now, as planned (None: unknown, or held)
    placement: Allocation | None = None  # where an admitted run's pieces go, node by node
    backfilled: bool = False  # admitted ahead of runs that wait before it in order


@dataclass(frozen=True)
class Plan:
    """What one pass knows of the cluster: each node's free resources now, and when each holding run is
    expected to end (seconds from now; None: unknown) with what it gives back on which node."""

    free: dict[str, Resources]
    total: Resources
    ends: list[tuple[float | None, Allocation]] = field(default_factory=list)


def _shortage(c: Candidate, free: Mapping[str, Mapping[str, float]]) -> str:
    total = {key: sum(node.get(key, 0.0) for node in free.values()) for key in RESOURCE_KEYS}
    short = [key for key in RESOURCE_KEYS if c.need.get(key, 0.0) > total.get(key, 0.0) + 1e-9]
    if short:
        return "; ".join(f"needs {amount(c.need[k], k)}, {max(0.0, total.get(k, 0.0)):g} free" for k in short)
    if pack(c.parts, free) is None:
        largest = max(c.parts, key=lambda p: (p.get("GPU", 0.0), p.get("CPU", 0.0)))
        return (
            f"fits the cluster's total but no node has {describe(largest)} free "
            f"(the most on one node: {describe(largest_room(free))})"
        )
    return ""


def admission_plan(
    waiting: Iterable[Candidate],
    cluster: Plan,
    usage: Mapping[str, Usage],
    limits: Mapping[str, Limits],
    now: datetime,
    aging_s: float,
    *,
    fair: FairShare | None = None,
    backfill: bool = True,
) -> list[Decision]:
    """The queue in admission order, each run admitted now or told why it waits and when it may start.

    Order: higher (aged) priority first, then the team and then the user with the smaller decayed usage
    over weight (FairShare), then the older run; each admission is charged as it is made, so one user's
    many runs interleave with everyone else's. A run held by its user's or its project's quota is passed
    over (`usage` and `limits` are keyed by user id and by project_account). Every other run
    gets the earliest start at which its pieces fit on real nodes for its expected length, around the
    runs ahead of it (backfill.Timeline): it starts now when that is now, even ahead of runs that wait
    before it, since it then takes no room they need before it ends. A run whose start cannot be known
    (what it needs is held by runs of unknown length) stops everyone behind it, as does the first run
    that does not start when `backfill` is off: no later run can overtake it and starve it."""
    fair = fair or FairShare()
    usage = {owner: Usage(u.runs, dict(u.held)) for owner, u in usage.items()}
    timeline = Timeline(cluster.free, cluster.ends)
    decisions: list[Decision] = []
    blocked = False
    waiting_ahead = 0
    # Keys only grow (admissions are charged), so a lazy heap keeps the order: a popped run whose key grew
    # since it was pushed goes back in with its new key.
    waiting = list(waiting)
    levels = [effective_priority(c.priority, (now - c.waiting_since).total_seconds(), aging_s) for c in waiting]
    heap = [(_order_key(c, levels[i], fair), i, c) for i, c in enumerate(waiting)]
    heapq.heapify(heap)
    while heap:
        key, i, candidate = heapq.heappop(heap)
        fresh = _order_key(candidate, levels[i], fair)
        if fresh != key:
            heapq.heappush(heap, (fresh, i, candidate))
            continue
        refusal = quotas_refusal(candidate, limits, usage)
        if refusal:
            decisions.append(Decision(candidate.run_id, False, refusal))
            continue
        slot = None if blocked else timeline.earliest(candidate.parts, candidate.duration_s)
        if slot is not None:
            timeline.reserve(slot[0], candidate.duration_s, slot[1])
        if slot is not None and slot[0] == 0.0:
            for account, _ in candidate.quota_accounts:
                usage[account] = usage.get(account, Usage()).plus(candidate.need)
            fair.charge(candidate, cluster.total)
            grant = f"granted {describe(candidate.need)}"
            if waiting_ahead:
                grant += (
                    f", ahead of {waiting_ahead} waiting run{'s' if waiting_ahead != 1 else ''} "
                    "(backfill: it ends before it could delay them)"
                )
            decisions.append(Decision(candidate.run_id, True, grant, placement=slot[1], backfilled=bool(waiting_ahead)))
            continue
        why = _shortage(candidate, timeline.free_now())
        if not why:
            why = "fits now, but would delay the runs ahead of it" if not blocked else ""
        ahead = f"{waiting_ahead} run{'s' if waiting_ahead != 1 else ''} ahead" if waiting_ahead else ""
        decisions.append(
            Decision(
                candidate.run_id,
                False,
                "; ".join(p for p in (why, ahead) if p) or "waits its turn",
                blocking=not waiting_ahead,
                expected_start_s=None if slot is None else slot[0],
            )
        )
        if slot is None or not backfill:
            blocked = True
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
    placement: Allocation = field(default_factory=dict)  # where it holds what (empty: unknown, never taken)
    borrowed: bool = False  # it holds room beyond its team's quota: a team within its quota takes it back


def _with(free: Mapping[str, Mapping[str, float]], extra: Allocation) -> dict[str, Resources]:
    merged = {name: dict(resources) for name, resources in free.items()}
    for name, resources in extra.items():
        merged[name] = add(merged.get(name, {}), resources)
    return merged


def preemption_victims(
    blocked: Candidate,
    free: Mapping[str, Mapping[str, float]],
    running: Iterable[Holder],
    coming_free: Allocation,
    *,
    reclaims: bool = False,
) -> list[str]:
    """Which running runs to preempt so that `blocked` (the run at the head of the queue that does not
    start) can: preemptible runs of a strictly lower priority, and when `reclaims` (its team is within its
    quota) runs borrowing beyond their own team's quota whatever their priority; borrowed ones first, then
    the lowest priority, then the youngest (the least work stands to wait), only as many as it takes for
    its pieces to fit on the nodes. None when runs already being preempted (`coming_free`) will make room,
    or when even every eligible run would not."""
    available = _with(free, coming_free)
    if pack(blocked.parts, available) is not None:
        return []
    rank = PRIORITY_RANK[RunPriority(blocked.priority)]
    eligible = [
        h
        for h in running
        if h.preemptible
        and h.placement  # where it holds its room must be known to count what it frees
        and (PRIORITY_RANK[RunPriority(h.priority)] < rank or (reclaims and h.borrowed))
    ]
    eligible.sort(key=lambda h: (not h.borrowed, PRIORITY_RANK[RunPriority(h.priority)], -h.created_at.timestamp()))
    victims: list[str] = []
    for holder in eligible:
        victims.append(holder.run_id)
        available = _with(available, holder.placement)
        if pack(blocked.parts, available) is not None:
            return victims
    return []
