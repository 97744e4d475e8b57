"""The scheduler's rules as plain functions (posttrain.scheduling.rules), against hand-worked queues."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from posttrain.scheduling.rules import (
    Candidate,
    FairShare,
    Holder,
    Limits,
    Plan,
    Usage,
    admission_plan,
    dominant_share,
    effective_priority,
    over_quota_alone,
    over_quotas_alone,
    preemption_victims,
    project_account,
    quota_refusal,
    too_large_for_cluster,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CLUSTER = {"CPU": 4.0, "GPU": 2.0}


def cand(
    run_id: str,
    owner: str = "a",
    priority: str = "normal",
    age_s: float = 0,
    cpus: float = 1,
    gpus: float = 0,
    duration_s: float | None = None,
    team: str = "",
    project: str = "",
):
    at = T0 - timedelta(seconds=age_s)
    need = {"CPU": cpus, "GPU": gpus}
    return Candidate(run_id, owner, priority, at, at, need, duration_s=duration_s, team=team, project=project)


def one_node(free=None, ends=()):
    """The cluster as one node of CLUSTER's size with `free` left."""
    return Plan({"n0": {"GPU": 0.0, **(free or CLUSTER)}}, dict(CLUSTER), list(ends))


def plan(waiting, free=None, usage=None, limits=None, now=T0, aging_s=1800.0, fair=None):
    decisions = admission_plan(waiting, one_node(free), usage or {}, limits or {}, now, aging_s, fair=fair)
    return [(d.run_id, d.admit, d.reason) for d in decisions]


def test_dominant_share_is_the_largest_share_of_any_resource():
    assert dominant_share({"CPU": 1.0, "GPU": 1.0}, CLUSTER) == 0.5  # 1/4 CPU, 1/2 GPU
    assert dominant_share({"CPU": 3.0}, CLUSTER) == 0.75
    assert dominant_share({"GPU": 1.0}, {"CPU": 4.0, "GPU": 0.0}) == 0.0  # a resource the cluster lacks counts not


def test_aging_raises_a_waiting_runs_priority_one_level_per_period():
    assert effective_priority("low", 0, 1800) == 0
    assert effective_priority("low", 1799, 1800) == 0
    assert effective_priority("low", 3600, 1800) == 2  # as high as a fresh high-priority run


def test_runs_that_fit_are_admitted_in_order_and_the_first_that_does_not_stops_the_rest():
    got = plan([cand("old", age_s=20, cpus=2), cand("big", age_s=10, cpus=3), cand("small", cpus=1)])
    assert got == [
        ("old", True, "granted 2 CPUs"),
        ("big", False, "needs 3 CPUs, 2 free"),
        # it would fit, but overtaking the big run could starve it forever
        ("small", False, "1 run ahead"),
    ]


def test_priority_beats_age():
    got = plan([cand("old-low", priority="low", age_s=600), cand("new-high", priority="high")], free={"CPU": 1})
    assert [(r, admit) for r, admit, _ in got] == [("new-high", True), ("old-low", False)]


def test_a_long_wait_lets_a_low_priority_run_overtake():
    got = plan([cand("starved", priority="low", age_s=7200), cand("new-high", priority="high")], free={"CPU": 1})
    assert got[0][:2] == ("starved", True)


def test_fair_share_puts_the_user_with_the_smaller_decayed_usage_first():
    # User a has used the cluster and queues four more runs; b queues one later: b's starts next.
    waiting = [cand(f"a{i}", owner="a", age_s=100 - i) for i in range(4)] + [cand("b0", owner="b", age_s=1)]
    got = plan(waiting, free={"CPU": 1.0, "GPU": 0.0}, fair=FairShare(user_usage={"a": 600.0}))
    assert got[0][:2] == ("b0", True) and [r for r, admit, _ in got if admit] == ["b0"]


def test_shares_count_each_admission_so_users_interleave():
    waiting = [cand(f"a{i}", owner="a", age_s=100 - i) for i in range(3)] + [
        cand(f"b{i}", owner="b", age_s=10 - i) for i in range(2)
    ]
    got = plan(waiting, free={"CPU": 4.0, "GPU": 0.0})
    assert [r for r, admit, _ in got if admit] == ["a0", "b0", "a1", "b1"]


def test_a_run_over_its_users_quota_waits_with_the_reason_and_blocks_no_one():
    limits = {"a": Limits(max_runs=2)}
    usage = {"a": Usage(runs=2, held={"CPU": 1.0, "GPU": 0.0}), "b": Usage(runs=1, held={"CPU": 2.0, "GPU": 0.0})}
    got = plan([cand("a-third", owner="a", age_s=60), cand("b0", owner="b")], usage=usage, limits=limits)
    assert got == [("a-third", False, "over your quota of 2 concurrent runs"), ("b0", True, "granted 1 CPU")]


def test_cpu_and_gpu_quotas_count_what_the_user_holds():
    used = Usage(runs=1, held={"CPU": 3.0, "GPU": 1.0})
    assert quota_refusal(Limits(max_cpus=4), used, {"CPU": 2.0}) == "over your quota of 4 CPUs (3 in use)"
    assert quota_refusal(Limits(max_gpus=1), used, {"CPU": 0.0, "GPU": 1.0}) == "over your quota of 1 GPUs (1 in use)"
    assert quota_refusal(Limits(max_cpus=4, max_gpus=2), used, {"CPU": 1.0, "GPU": 1.0}) is None


def test_a_project_quota_counts_the_runs_of_every_user_of_the_project_together():
    limits = {project_account("alpha"): Limits(max_runs=2)}
    usage = {project_account("alpha"): Usage(runs=1, held={"CPU": 1.0, "GPU": 0.0})}  # one run of a's holds
    waiting = [
        cand("b0", owner="b", project="alpha", age_s=30),
        cand("c0", owner="c", project="alpha", age_s=20),
        cand("d0", owner="d", project="beta", age_s=10),
    ]
    assert plan(waiting, usage=usage, limits=limits) == [
        ("b0", True, "granted 1 CPU"),
        ("c0", False, "over project alpha's quota of 2 concurrent runs"),
        ("d0", True, "granted 1 CPU"),  # another project's quota is not alpha's
    ]


def test_the_tightest_of_the_users_and_the_projects_quotas_holds_a_run():
    waiting = [cand(f"a{i}", owner="a", project="alpha", age_s=10 - i) for i in range(3)]
    user_tighter = {"a": Limits(max_runs=1), project_account("alpha"): Limits(max_runs=2)}
    project_tighter = {"a": Limits(max_runs=3), project_account("alpha"): Limits(max_cpus=1.5)}
    assert [reason for _, _, reason in plan(waiting, limits=user_tighter)][1:] == [
        "over your quota of 1 concurrent run",
        "over your quota of 1 concurrent run",
    ]
    assert [reason for _, _, reason in plan(waiting, limits=project_tighter)][1:] == [
        "over project alpha's quota of 1.5 CPUs (1 in use)",
        "over project alpha's quota of 1.5 CPUs (1 in use)",
    ]
    too_big = cand("big", owner="a", project="alpha", cpus=2)
    assert over_quotas_alone(too_big, project_tighter) == "needs 2 CPUs, more than project alpha's quota of 1.5"
    assert over_quotas_alone(too_big, {project_account("alpha"): Limits(max_runs=0)}) == (
        "project alpha's quota allows no runs"
    )


@pytest.mark.parametrize(
    ("need", "limits", "reason"),
    [
        ({"CPU": 3.0}, Limits(max_cpus=2), "needs 3 CPUs, more than your quota of 2"),
        ({"CPU": 1.0, "GPU": 2.0}, Limits(max_gpus=1), "needs 2 GPUs, more than your quota of 1"),
        ({"CPU": 1.0}, Limits(max_runs=0), "your quota allows no runs"),
        ({"CPU": 1.0}, Limits(max_runs=1, max_cpus=1), None),
    ],
)
def test_a_run_larger_than_its_quota_can_never_start(need, limits, reason):
    assert over_quota_alone(need, limits) == reason


def test_a_piece_larger_than_every_node_can_never_fit_the_cluster():
    nodes = [{"CPU": 2.0, "GPU": 0.0}, {"CPU": 2.0, "GPU": 0.0}]
    assert too_large_for_cluster([{"CPU": 2.0}, {"CPU": 2.0}], nodes) is None  # two bundles, one per node
    reason = too_large_for_cluster([{"CPU": 3.0}], nodes)
    assert reason.startswith("needs 3 CPUs in one place; the cluster's largest node has 2 CPUs")


def holder(run_id: str, priority: str = "low", age_s: float = 0, cpus: float = 1, preemptible: bool = True, **kw):
    held = {"CPU": cpus, "GPU": 0.0}
    return Holder(run_id, priority, T0 - timedelta(seconds=age_s), held, preemptible, placement={"n0": held}, **kw)


NONE_FREE = {"n0": {"CPU": 0.0, "GPU": 0.0}}
NOTHING_COMING: dict = {}


def test_the_run_that_stops_admission_is_marked_blocking_and_only_that_one():
    decisions = admission_plan([cand("a", cpus=3), cand("b", cpus=3, age_s=1)], one_node(), {}, {}, T0, 1800.0)
    assert [(d.run_id, d.admit, d.blocking) for d in decisions] == [("b", True, False), ("a", False, True)]


def test_preemption_takes_the_lowest_priority_then_the_youngest_and_only_as_many_as_needed():
    running = [
        holder("old-low", "low", age_s=100),
        holder("young-low", "low", age_s=10),
        holder("normal", "normal", age_s=5),
    ]
    assert preemption_victims(cand("h", priority="high", cpus=1), NONE_FREE, running, NOTHING_COMING) == ["young-low"]
    assert preemption_victims(cand("h", priority="high", cpus=2), NONE_FREE, running, NOTHING_COMING) == [
        "young-low",
        "old-low",
    ]
    assert preemption_victims(cand("h", priority="high", cpus=3), NONE_FREE, running, NOTHING_COMING) == [
        "young-low",
        "old-low",
        "normal",
    ]


def test_preemption_spares_equal_priorities_opted_out_runs_and_pointless_cases():
    running = [holder("normal", "normal"), holder("pinned", "low", preemptible=False), holder("low", "low")]
    # Equal priority and the opted-out run are never taken: freeing only "low" is not enough for 2 CPUs.
    assert preemption_victims(cand("n", priority="high", cpus=2), NONE_FREE, running[1:], NOTHING_COMING) == []
    assert preemption_victims(cand("n", priority="normal", cpus=1), NONE_FREE, running, NOTHING_COMING) == ["low"]
    assert preemption_victims(cand("n", priority="low", cpus=1), NONE_FREE, running, NOTHING_COMING) == []


def test_runs_already_preempting_count_as_room_on_its_way():
    running = [holder("low", "low")]
    coming = {"n0": {"CPU": 1.0, "GPU": 0.0}}
    assert preemption_victims(cand("h", priority="high", cpus=1), NONE_FREE, running, coming) == []
    assert preemption_victims(cand("h", priority="high", cpus=2), NONE_FREE, running, coming) == ["low"]
