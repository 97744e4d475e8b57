"""Backfill and per-node placement (posttrain.scheduling.backfill, scheduling.admission_plan), and the simulated
cluster that drives the same code (posttrain.scheduling.cluster_sim): hand-worked cases, then property tests over
random clusters and traces."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.scheduling.backfill import Timeline, pack
from posttrain.scheduling.cluster_sim import TraceRun, candidate, gpu_cluster, mixed_trace, simulate
from posttrain.scheduling.rules import Candidate, FairShare, Plan, admission_plan

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def cpus(n: float) -> dict[str, float]:
    return {"CPU": float(n), "GPU": 0.0}


def gpus(n: float) -> dict[str, float]:
    return {"CPU": 0.0, "GPU": float(n)}


def cand(run_id, need, *, duration_s=None, priority="normal", age_s=0.0, pieces=()):
    at = T0 - timedelta(seconds=age_s)
    return Candidate(run_id, "a", priority, at, at, need, pieces=tuple(pieces), duration_s=duration_s)


def decide(waiting, free, ends=(), backfill=True):
    total = {key: sum(node[key] for node in free.values()) for key in ("CPU", "GPU")}
    decisions = admission_plan(waiting, Plan(free, total, list(ends)), {}, {}, T0, 0.0, backfill=backfill)
    return {d.run_id: d for d in decisions}


# --- placement on nodes -------------------------------------------------------------------------------


def test_pack_puts_every_piece_on_the_fullest_node_that_holds_them_all():
    free = {"a": cpus(4), "b": cpus(2), "c": cpus(8)}
    assert pack([cpus(1), cpus(1)], free) == {"b": cpus(2)}


def test_pack_spreads_pieces_no_node_holds_together_largest_first_staying_on_nodes_it_uses():
    free = {"a": gpus(2), "b": gpus(3)}
    assert pack([gpus(1), gpus(2), gpus(2)], free) == {"a": gpus(2), "b": gpus(3)}
    assert pack([gpus(2), gpus(2), gpus(2)], free) is None


def test_a_run_that_fits_the_clusters_total_but_no_node_waits_with_that_reason():
    got = decide([cand("big", cpus(2))], {"n0": cpus(1), "n1": cpus(1)})["big"]
    assert not got.admit
    assert got.reason == "fits the cluster's total but no node has 2 CPUs free (the most on one node: 1 CPU)"


def test_an_admitted_run_is_placed_on_the_node_that_holds_it():
    got = decide([cand("r", cpus(2))], {"n0": cpus(1), "n1": cpus(3)})["r"]
    assert got.admit and got.placement == {"n1": cpus(2)}


# --- backfill -----------------------------------------------------------------------------------------

FULL_IN_100S = [(100.0, {"n0": cpus(2)})]  # a run holding 2 of the node's 3 CPUs ends in 100 s


def test_a_short_run_starts_ahead_of_a_blocked_one_when_it_ends_before_that_one_could_start():
    waiting = [cand("head", cpus(3), duration_s=500, age_s=10), cand("short", cpus(1), duration_s=90)]
    got = decide(waiting, {"n0": cpus(1)}, FULL_IN_100S)
    assert not got["head"].admit and got["head"].expected_start_s == 100.0
    assert got["short"].admit and got["short"].backfilled
    assert got["short"].reason == "granted 1 CPU, ahead of 1 waiting run (backfill: it ends before it could delay them)"


def test_a_run_that_would_delay_a_run_ahead_waits_and_says_so():
    waiting = [cand("head", cpus(3), duration_s=500, age_s=10), cand("long", cpus(1), duration_s=101)]
    got = decide(waiting, {"n0": cpus(1)}, FULL_IN_100S)
    assert not got["long"].admit and got["long"].expected_start_s == 600.0
    assert got["long"].reason == "fits now, but would delay the runs ahead of it; 1 run ahead"


def test_without_expected_lengths_or_with_backfill_off_the_first_run_that_waits_holds_everyone_behind():
    unknown = [cand("head", cpus(3), duration_s=500, age_s=10), cand("short", cpus(1), duration_s=None)]
    assert not decide(unknown, {"n0": cpus(1)}, FULL_IN_100S)["short"].admit  # it might never end
    running_unknown = [(None, {"n0": cpus(2)})]
    waiting = [cand("head", cpus(3), duration_s=500, age_s=10), cand("short", cpus(1), duration_s=1)]
    got = decide(waiting, {"n0": cpus(1)}, running_unknown)
    assert got["head"].expected_start_s is None and not got["short"].admit
    assert got["short"].reason == "1 run ahead"
    off = decide(waiting, {"n0": cpus(1)}, FULL_IN_100S, backfill=False)
    assert not off["short"].admit and off["head"].expected_start_s == 100.0


def test_a_run_past_its_expected_end_still_holds_its_room_until_it_stops():
    # Its engine finished its last step (or overran its estimate) but the run has not ended: admitting
    # another run into its room now would put two on the node at once.
    overdue = [(0.0, {"n0": cpus(2)})]
    got = decide([cand("next", cpus(2), duration_s=60)], {"n0": cpus(0)}, overdue)["next"]
    assert not got.admit and got.reason == "needs 2 CPUs, 0 free" and got.expected_start_s == 1.0
    assert Timeline({"n0": cpus(0)}, overdue).earliest([cpus(2)], 60.0) == (1.0, {"n0": cpus(2)})


def test_the_timeline_gives_the_earliest_start_around_reservations():
    timeline = Timeline({"n0": gpus(1), "n1": gpus(0)}, [(50.0, {"n1": gpus(2)})])
    assert timeline.earliest([gpus(2)], 10.0) == (50.0, {"n1": gpus(2)})
    timeline.reserve(50.0, 100.0, {"n1": gpus(2)})
    assert timeline.earliest([gpus(2)], 10.0) == (150.0, {"n1": gpus(2)})
    assert timeline.earliest([gpus(1)], None) == (0.0, {"n0": gpus(1)})
    assert timeline.earliest([gpus(3)], 1.0) is None


# --- properties over random clusters and traces -------------------------------------------------------

sizes = st.sampled_from([1.0, 2.0, 3.0, 4.0])
lengths = st.floats(min_value=1.0, max_value=1000.0, allow_nan=False)


@st.composite
def queues(draw):
    """A cluster of 1-4 nodes, what runs on it and for how long, and 1-10 waiting runs of 1-2 pieces."""
    nodes = {f"n{i}": gpus(draw(st.sampled_from([2.0, 4.0, 8.0]))) for i in range(draw(st.integers(1, 4)))}
    free = {name: dict(r) for name, r in nodes.items()}
    ends = []
    for name in nodes:
        held = draw(st.floats(min_value=0.0, max_value=nodes[name]["GPU"]).map(math.floor))
        if held:
            free[name]["GPU"] -= held
            ends.append((draw(lengths), {name: gpus(held)}))
    waiting = []
    for i in range(draw(st.integers(1, 10))):
        pieces = [gpus(draw(sizes)) for _ in range(draw(st.integers(1, 2)))]
        need = gpus(sum(p["GPU"] for p in pieces))
        waiting.append(
            Candidate(
                f"w{i}",
                "a",  # one user: fair share charges then shift every key alike, and the order stays comparable
                draw(st.sampled_from(["low", "normal", "high"])),
                T0 - timedelta(seconds=i),
                T0 - timedelta(seconds=i),
                need,
                pieces=tuple(pieces),
                duration_s=draw(lengths),
            )
        )
    return nodes, free, ends, waiting


def expected_starts(waiting, free, ends, nodes):
    total = {key: sum(node[key] for node in nodes.values()) for key in ("CPU", "GPU")}
    decisions = admission_plan(waiting, Plan(free, total, ends), {}, {}, T0, 0.0, fair=FairShare())
    return decisions, {d.run_id: d.expected_start_s if not d.admit else 0.0 for d in decisions}


def started(free, ends, waiting, decisions, ids):
    """The cluster once the runs `ids` started as `decisions` placed them."""
    free = {name: dict(r) for name, r in free.items()}
    ends = list(ends)
    by_id = {c.run_id: c for c in waiting}
    for d in decisions:
        if d.run_id in ids:
            for name, r in d.placement.items():
                free[name] = {k: free[name][k] - r[k] for k in r}
            ends.append((by_id[d.run_id].duration_s, d.placement))
    return free, ends


def assert_backfill_delays_no_run_ahead(nodes, free, ends, waiting, decisions) -> None:
    """After the pass, each run still waiting is expected to start no later than in a world in which the
    runs backfilled from behind it never came (the next pass sees them running)."""
    order = [d.run_id for d in decisions]
    admitted = {d.run_id for d in decisions if d.admit}
    backfilled = {d.run_id for d in decisions if d.backfilled}
    after_pass, _ = started(free, ends, waiting, decisions, admitted)
    assert all(r["GPU"] >= -1e-9 for r in after_pass.values()), "a node over-committed"
    left = [c for c in waiting if c.run_id not in admitted]
    _, after = expected_starts(left, *started(free, ends, waiting, decisions, admitted), nodes)
    for position, run_id in enumerate(order):
        behind = {b for b in order[position + 1 :] if b in backfilled}
        if run_id in admitted or not behind:
            continue
        _, never = expected_starts(left, *started(free, ends, waiting, decisions, admitted - behind), nodes)
        if never[run_id] is not None:
            assert after[run_id] is not None and after[run_id] <= never[run_id] + 1e-6, (run_id, behind)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queues())
def test_backfill_never_delays_the_expected_start_of_a_run_ahead(queue):
    nodes, free, ends, waiting = queue
    decisions, _ = expected_starts(waiting, free, ends, nodes)
    assert_backfill_delays_no_run_ahead(nodes, free, ends, waiting, decisions)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000))
def test_over_a_random_trace_on_the_simulated_cluster_no_pass_delays_a_run_ahead(seed):
    nodes = gpu_cluster(nodes=4)
    trace = mixed_trace(40, seed=seed, mean_gap_s=30.0, owners=1)
    passes = []

    def check(now_s, waiting, running, decisions, plan):
        given = [candidate(r, r.length_s) for r in waiting.values()]  # no preemption here: all of it is left
        assert_backfill_delays_no_run_ahead(nodes, plan.free, plan.ends, given, decisions)
        passes.append(sum(d.backfilled for d in decisions))

    simulate(trace, nodes, check=check)
    assert passes


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.booleans())
def test_a_simulated_64_gpu_cluster_never_over_commits_a_node_and_every_run_ends(seed, preemption):
    trace = mixed_trace(60, seed=seed, mean_gap_s=60.0)
    result = simulate(trace, gpu_cluster(), preemption=preemption)  # raises on an over-committed node
    assert all(o.end_s is not None and o.start_s >= o.run.arrival_s for o in result.outcomes.values())


def test_on_a_simulated_cluster_backfill_starts_the_small_run_in_the_gap_and_no_one_ahead_waits_longer():
    trace = [
        TraceRun("long", 0.0, 100.0, gpus(6)),
        TraceRun("wide", 1.0, 50.0, gpus(8), priority="high"),
        TraceRun("small", 2.0, 90.0, gpus(2), priority="low"),
        TraceRun("late", 3.0, 200.0, gpus(2), priority="low"),
    ]
    nodes = {"n0": gpus(8)}
    off = simulate(trace, nodes, backfill=False).outcomes
    on = simulate(trace, nodes, backfill=True).outcomes
    assert (off["small"].start_s, on["small"].start_s) == (150.0, 2.0)
    assert on["wide"].start_s == off["wide"].start_s == 100.0
    assert on["late"].start_s == off["late"].start_s == 150.0
