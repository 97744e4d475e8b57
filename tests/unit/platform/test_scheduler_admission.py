"""Admission on the database (posttrain.scheduling.services): a fake Ray cluster view and Jobs client
stand in for Ray here; tests/integration/test_scheduler.py runs the same against a real Ray head."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import connection

from posttrain.runs import services
from posttrain.runs.models import Run
from posttrain.runs.services.state_machine import S
from posttrain.scheduling.models import ClusterSnapshot, Quota
from posttrain.scheduling.rules import ClusterNode, ClusterView
from posttrain.scheduling.services import RAY_REPORT_LAG_S, runs_admit
from tests.unit.platform.helpers import FakeJobs, a_researcher, cluster, launch, make_run, state

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]


def test_runs_that_do_not_fit_wait_with_a_reason_and_start_in_order_as_others_end(experiment, researcher):
    jobs = FakeJobs()
    runs = [launch(experiment, researcher) for _ in range(3)]
    assert runs_admit(cluster=cluster(2.0), jobs=jobs) == [str(runs[0].pk), str(runs[1].pk)]
    assert jobs.submitted == [str(runs[0].pk), str(runs[1].pk)] and state(runs[0]) == S.STARTING
    runs[2].refresh_from_db()
    assert (runs[2].state, runs[2].queue_position, runs[2].queue_reason) == (S.QUEUED, 1, "needs 1 CPU, 0 free")
    assert runs[0].transitions.last().reason == "admitted: granted 1 CPU"

    services.run_transition(runs[0].pk, [S.STARTING], S.SUCCEEDED, "done")
    assert runs_admit(cluster=cluster(2.0, free=0.0), jobs=jobs) == [str(runs[2].pk)]  # Ray's report lags
    runs[2].refresh_from_db()
    assert (runs[2].state, runs[2].queue_position, runs[2].queue_reason) == (S.STARTING, None, "")


def test_the_cluster_snapshot_is_kept_for_the_queue_page(experiment, researcher):
    launch(experiment, researcher)
    runs_admit(cluster=cluster(2.0, nodes=2), jobs=FakeJobs())
    snapshot = ClusterSnapshot.objects.get()
    assert snapshot.total == {"CPU": 4.0, "GPU": 0.0} and [n["node_id"] for n in snapshot.nodes] == ["n0", "n1"]


def test_resources_other_jobs_use_are_not_given_away(experiment, researcher):
    run = launch(experiment, researcher)
    assert runs_admit(cluster=cluster(2.0, free=0.5), jobs=FakeJobs()) == []  # 1.5 CPUs held outside Posttrain
    run.refresh_from_db()
    assert run.queue_reason == "needs 1 CPU, 0.5 free"


def two_nodes_ray_reports(used_cpus: dict[str, float]):
    """Two 1-CPU nodes as Ray's report shows them: n0 and n1, each with the CPUs in use given."""
    view = ClusterView(
        [
            ClusterNode(
                name, f"10.0.0.{i}", {"CPU": 1.0, "GPU": 0.0}, {"CPU": 1.0 - used_cpus.get(name, 0.0), "GPU": 0.0}
            )
            for i, name in enumerate(("n0", "n1"))
        ]
    )
    return lambda: view


def test_a_run_ray_placed_on_another_node_than_predicted_does_not_hold_both(experiment, researcher):
    # Admission placed the first run on n0; Ray put its driver on n1 and reports n0 idle.
    first = launch(experiment, researcher)
    assert runs_admit(cluster=two_nodes_ray_reports({}), jobs=FakeJobs()) == [str(first.pk)]
    first.refresh_from_db()
    assert first.placement == {"n0": {"CPU": 1.0, "GPU": 0.0}}
    second = launch(experiment, researcher)
    ray_put_it_on_n1 = two_nodes_ray_reports({"n1": 1.0})

    # Within Ray's report lag the use on n1 may be another job's: the second run waits.
    assert runs_admit(cluster=ray_put_it_on_n1, jobs=FakeJobs()) == []
    second.refresh_from_db()
    assert second.queue_reason == "needs 1 CPU, 0 free"

    # Past it, the idle grant on n0 and the use on n1 are the same run: n0 is free.
    later = first.state_changed_at + timedelta(seconds=RAY_REPORT_LAG_S + 1)
    assert runs_admit(cluster=ray_put_it_on_n1, jobs=FakeJobs(), now=later) == [str(second.pk)]
    second.refresh_from_db()
    assert second.placement == {"n0": {"CPU": 1.0, "GPU": 0.0}}


def test_an_idle_grant_frees_nothing_when_no_other_node_shows_use_beyond_its_grants(experiment, researcher):
    first = launch(experiment, researcher)
    runs_admit(cluster=two_nodes_ray_reports({}), jobs=FakeJobs())
    first.refresh_from_db()
    second, third = launch(experiment, researcher), launch(experiment, researcher)
    later = first.state_changed_at + timedelta(seconds=RAY_REPORT_LAG_S + 1)
    # Ray shows nothing in use yet (its job still pending): the first run's CPU stays granted, one is left.
    assert runs_admit(cluster=two_nodes_ray_reports({}), jobs=FakeJobs(), now=later) == [str(second.pk)]
    third.refresh_from_db()
    assert third.queue_reason.startswith("needs 1 CPU, 0 free")


def test_a_run_larger_than_any_node_is_held_with_the_reason_and_blocks_no_one(experiment, researcher):
    big = launch(
        experiment,
        researcher,
        resources={"driver": {"CPU": 4.0, "GPU": 0.0}, "bundles": [], "total": {"CPU": 4.0, "GPU": 0.0}},
    )
    small = launch(experiment, researcher)
    assert runs_admit(cluster=cluster(2.0, nodes=2), jobs=FakeJobs()) == [str(small.pk)]
    big.refresh_from_db()
    assert big.state == S.QUEUED and big.queue_position is None
    assert big.queue_reason.startswith("can never start as it is: needs 4 CPUs in one place")


def test_quotas_of_the_user_and_of_their_groups_hold_runs_with_the_reason(experiment, researcher):
    group = Group.objects.create(name="lab-a")
    researcher.groups.add(group)
    Quota.objects.create(group=group, max_runs=1)
    Quota.objects.create(user=researcher, max_runs=3, max_cpus=8)
    first, second = launch(experiment, researcher), launch(experiment, researcher)
    other = launch(experiment, a_researcher("bob"))
    assert runs_admit(cluster=cluster(4.0), jobs=FakeJobs()) == [str(first.pk), str(other.pk)]
    second.refresh_from_db()
    assert (second.state, second.queue_reason) == (S.QUEUED, "over your quota of 1 concurrent run")


def test_a_run_cancelled_before_admission_is_never_submitted(experiment, researcher):
    run = launch(experiment, researcher)
    services.run_cancel(run, user=researcher)
    jobs = FakeJobs()
    assert runs_admit(cluster=cluster(2.0), jobs=jobs) == [] and jobs.submitted == []
    assert state(run) == S.CANCELLED


def test_a_run_ray_cannot_take_yet_goes_back_to_the_queue(experiment, researcher):
    from posttrain.core.errors import JobsUnavailable

    jobs = FakeJobs()
    jobs.fail_submit = JobsUnavailable("No available agent to submit job")
    run = launch(experiment, researcher)
    runs_admit(cluster=cluster(2.0), jobs=jobs)
    assert state(run) == S.QUEUED and "could not take the job yet" in run.state_reason


def test_all_at_once_admits_nothing(experiment, researcher, settings):
    settings.SCHEDULER = "all-at-once"
    launch(experiment, researcher)
    assert runs_admit(cluster=cluster(2.0), jobs=FakeJobs()) == []


def test_a_run_that_ends_asks_for_admission_after_commit(experiment, no_dispatch, django_capture_on_commit_callbacks):
    run = make_run(experiment, S.RUNNING)
    no_dispatch.clear()
    with django_capture_on_commit_callbacks(execute=True):
        services.run_transition(run.pk, [S.RUNNING], S.SUCCEEDED, "done")
    assert no_dispatch == [("admit_runs", str(run.pk))]


@pytest.mark.django_db(transaction=True)
def test_two_workers_racing_never_over_admit(experiment, researcher):
    if connection.vendor != "postgresql":
        pytest.skip("needs a database with concurrent writers (Postgres)")
    runs = [launch(experiment, researcher) for _ in range(6)]
    barrier = threading.Barrier(4)
    admitted: list[list[str]] = []

    def worker() -> None:
        try:
            barrier.wait()
            admitted.append(runs_admit(cluster=cluster(3.0), jobs=FakeJobs()))  # each its own DB connection
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [run_id for batch in admitted for run_id in batch]
    assert len(flat) == len(set(flat)) == 3  # a 3-CPU cluster, 1-CPU runs
    assert Run.objects.filter(pk__in=[r.pk for r in runs], state=S.STARTING).count() == 3


def test_rays_load_report_gives_each_nodes_total_and_free_cpus_and_gpus():
    from workers.ray_cluster import parse_load_report

    view = parse_load_report(
        {
            "usageByNode": {
                "b-node": {"CPU": [1.0, 2.0], "node:10.0.0.2": [0.0, 1.0], "memory": [0.0, 1e9]},
                "a-head": {
                    "CPU": [0.5, 2.0],
                    "GPU": [1.0, 1.0],
                    "node:10.0.0.1": [0.0, 1.0],
                    "node:InternalHead": [0, 1],
                },
            }
        }
    )
    assert [(n.node_id, n.address, n.head) for n in view.nodes] == [
        ("a-head", "10.0.0.1", True),
        ("b-node", "10.0.0.2", False),
    ]
    assert view.nodes[0].free == {"CPU": 1.5, "GPU": 0.0} and view.nodes[1].total == {"CPU": 2.0, "GPU": 0.0}
    assert view.total == {"CPU": 4.0, "GPU": 1.0} and view.free == {"CPU": 2.5, "GPU": 0.0}
