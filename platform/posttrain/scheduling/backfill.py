"""Placement on real nodes and the timeline backfill plans against: plain functions over plain values.

`pack` places a run's pieces (its driver and the bundles of its placement group) on nodes the way Ray's
PACK strategy does: every piece on one node when one can hold them all (the fullest such node, so the
emptier ones stay whole for larger runs), else piece by piece, largest first, each on the node the run
already uses when it fits there, else on the fullest node that can hold it.

`Timeline` is what the cluster's nodes have free from now on: the holding runs give their resources back
when they are expected to end, and each waiting run planned so far holds its reservation. Conservative
backfill (Slurm's rule, docs/SCHEDULER.md "Backfill"): every waiting run in order gets the earliest start
at which its pieces fit on the nodes for its whole expected length, around the reservations of the runs
ahead of it; a run whose earliest start is now starts now. A run behind therefore only ever takes room
that no run ahead needs before the run behind is expected to end, so it cannot delay them.

Times are seconds from now; an unknown length or end is infinite (it never gives its room back)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

KEYS = ("CPU", "GPU")
EPS = 1e-9
# A holding run gives its room back when it stops, not when it was expected to: one at or past its expected
# end is taken to stop this soon (seconds), never now, so nothing is admitted on top of it.
OVERDUE_S = 1.0
Resources = dict[str, float]
Allocation = dict[str, Resources]  # node id -> what the run holds there


def _vector(resources: Mapping[str, float]) -> np.ndarray:
    return np.array([float(resources.get(key, 0.0)) for key in KEYS])


def _as_resources(vector: np.ndarray) -> Resources:
    return {key: float(value) for key, value in zip(KEYS, vector)}


def _fullest(room: np.ndarray, fitting: np.ndarray) -> int:
    """Of the nodes marked `fitting`, the one with the least room (GPUs first, then CPUs), then the first."""
    candidates = np.nonzero(fitting)[0]
    order = np.lexsort((candidates, room[candidates, 0], room[candidates, 1]))
    return int(candidates[order[0]])


def _pack(pieces: np.ndarray, room: np.ndarray) -> np.ndarray | None:
    """`pack` over arrays: pieces (P, R) on nodes' room (N, R); what each node gets (N, R), or None."""
    whole = pieces.sum(axis=0)
    holding = (room + EPS >= whole).all(axis=1)
    allocation = np.zeros_like(room)
    if holding.any():
        allocation[_fullest(room, holding)] = whole
        return allocation
    room = room.copy()
    for piece in pieces[np.lexsort((-pieces[:, 0], -pieces[:, 1]))]:  # GPUs first, then CPUs, largest first
        fitting = (room + EPS >= piece).all(axis=1)
        if not fitting.any():
            return None
        used = fitting & allocation.any(axis=1)
        node = _fullest(room, used if used.any() else fitting)
        room[node] -= piece
        allocation[node] += piece
    return allocation


def _pieces(pieces: Sequence[Mapping[str, float]]) -> np.ndarray:
    wanted = [_vector(p) for p in pieces if any(p.get(key, 0.0) > 0 for key in KEYS)]
    return np.array(wanted).reshape(len(wanted), len(KEYS))


def pack(pieces: Sequence[Mapping[str, float]], free: Mapping[str, Mapping[str, float]]) -> Allocation | None:
    """Where Ray would put `pieces` given each node's `free` resources; None when they do not fit."""
    names = sorted(free)
    wanted = _pieces(pieces)
    if not len(wanted):
        return {}
    room = np.array([_vector(free[name]) for name in names]).reshape(len(names), len(KEYS))
    allocation = _pack(wanted, room) if names else None
    return None if allocation is None else _allocation(names, allocation)


def _allocation(names: Sequence[str], allocation: np.ndarray) -> Allocation:
    return {names[i]: _as_resources(allocation[i]) for i in np.nonzero(allocation.any(axis=1))[0]}


def largest_room(free: Mapping[str, Mapping[str, float]]) -> Resources:
    """The most any one node has free (GPUs first, then CPUs)."""
    best = max(free.values(), key=lambda r: (r.get("GPU", 0.0), r.get("CPU", 0.0)), default={})
    return {key: float(best.get(key, 0.0)) for key in KEYS}


class Timeline:
    """Each node's free resources over time: `free[k]` holds from `times[k]` until `times[k + 1]` (the last
    row for ever). Built from the nodes' free resources now and the holding runs' expected ends."""

    def __init__(self, free_now: Mapping[str, Mapping[str, float]], ends: Iterable[tuple[float | None, Allocation]]):
        self.nodes = sorted(free_now)
        self._index = {name: i for i, name in enumerate(self.nodes)}
        self.times = np.array([0.0])
        self.free = np.array([[_vector(free_now[name]) for name in self.nodes]]).reshape(1, len(self.nodes), len(KEYS))
        for at, allocation in ends:
            if at is not None and math.isfinite(at):
                self._change(max(OVERDUE_S, at), math.inf, allocation, sign=1.0)

    def _split(self, at: float) -> int:
        """The row that starts at `at`, made by splitting the row that holds `at` when none does."""
        index = int(np.searchsorted(self.times, at))
        if index < len(self.times) and self.times[index] == at:
            return index
        self.times = np.concatenate((self.times[:index], [at], self.times[index:]))
        self.free = np.concatenate((self.free[:index], self.free[index - 1 : index], self.free[index:]))
        return index

    def _change(self, start: float, end: float, allocation: Allocation, sign: float) -> None:
        first = self._split(start)
        last = self._split(end) if math.isfinite(end) else len(self.times)
        for name, resources in allocation.items():
            if name in self._index:
                self.free[first:last, self._index[name]] += sign * _vector(resources)

    def reserve(self, start: float, length: float | None, allocation: Allocation) -> None:
        """A run planned to hold `allocation` from `start` for `length` seconds (None: for ever)."""
        self._change(start, start + length if length is not None else math.inf, allocation, sign=-1.0)

    def _least_free(self, length: float | None) -> np.ndarray:
        """For every row k: each node's least free resources from times[k] for `length` seconds (None: for
        ever), shape (rows, nodes, resources). Sparse-table minima, so every start is tried at once."""
        rows = len(self.times)
        if length is None or not math.isfinite(length):
            return np.minimum.accumulate(self.free[::-1], axis=0)[::-1]
        starts = np.arange(rows)
        ends = np.maximum(np.searchsorted(self.times, self.times + length, side="left"), starts + 1)
        spans = ends - starts
        depth = int(spans.max()).bit_length()  # table[j][k]: the minimum over rows k .. k + 2^j - 1
        table = np.empty((depth, *self.free.shape))
        table[0] = self.free
        for j in range(1, depth):
            half = 1 << (j - 1)
            np.minimum(table[j - 1, : rows - half], table[j - 1, half:], out=table[j, : rows - half])
            table[j, rows - half :] = table[j - 1, rows - half :]
        level = np.log2(spans).astype(int)
        return np.minimum(table[level, starts], table[level, ends - (1 << level)])

    def earliest(self, pieces: Sequence[Mapping[str, float]], length: float | None) -> tuple[float, Allocation] | None:
        """The earliest start at which `pieces` fit on the nodes for `length` seconds (None: for ever), and
        where; None when they never do (the room they need is held for ever)."""
        wanted = _pieces(pieces)
        if not len(wanted):
            return 0.0, {}
        least = self._least_free(length)
        whole = wanted.sum(axis=0)
        one_node = (least + EPS >= whole).all(axis=2)  # (rows, nodes): a node that holds every piece
        if len(wanted) == 1 or one_node.any():
            rows = np.nonzero(one_node.any(axis=1))[0]
            if len(rows) and (len(wanted) == 1 or rows[0] == 0):
                k = int(rows[0])
                allocation = np.zeros_like(least[k])
                allocation[_fullest(least[k], one_node[k])] = whole
                return float(self.times[k]), _allocation(self.nodes, allocation)
            if len(wanted) == 1:
                return None
        # Several pieces: the cluster's sum and one node's room for the largest piece first (cheap).
        enough = (least.sum(axis=1) + EPS >= whole).all(axis=1) & (least.max(axis=1) + EPS >= wanted.max(axis=0)).all(
            axis=1
        )
        for k in np.nonzero(enough)[0]:
            placed = _pack(wanted, least[k])
            if placed is not None:
                return float(self.times[k]), _allocation(self.nodes, placed)
        return None

    def free_now(self) -> dict[str, Resources]:
        return {name: _as_resources(self.free[0, i]) for i, name in enumerate(self.nodes)}
