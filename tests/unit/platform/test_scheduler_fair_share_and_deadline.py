"""Fair share over time, lending quotas, per-node admission and the preemption deadline on the database
(posttrain.scheduling.services, runs.fair_share, scheduling.services.jobs): a fake cluster view and Jobs client
stand in for Ray."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from posttrain.runs.models import Run
from posttrain.runs.services.state_machine import S
from posttrain.scheduling import services
from posttrain.scheduling.fair_share import holdings, usage_by_owner
from posttrain.scheduling.models import ClusterSample, ClusterSnapshot, Preemption, Quota
from posttrain.scheduling.rules import ClusterNode, ClusterView, decayed_usage
from posttrain.scheduling.services import runs_admit
from posttrain.telemetry.event_schema import parse_batch
from posttrain.telemetry.ingestion import events_ingest
from posttrain.telemetry.models import MetricRow
from tests.unit.platform.helpers import FakeJobs, a_researcher, cluster, cpus, event, held_between, launch, state

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]

HOUR = 3600.0


def test_decayed_usage_is_the_integral_of_share_halved_every_half_life():
    assert decayed_usage(0.5, HOUR, 0.0, HOUR) == pytest.approx(0.5 * HOUR / math.log(2) * 0.5)
    assert decayed_usage(1.0, 2 * HOUR, HOUR, HOUR) == pytest.approx(HOUR / math.log(2) * 0.25)
    assert decayed_usage(1.0, 10.0, 0.0, 0.0) == 10.0  # no half-life: plain share-seconds


def test_decayed_fair_share_orders_two_users_runs_as_the_formula_says(experiment, researcher, settings):
    settings.SCHEDULER_USAGE_HALF_LIFE_S = HOUR
    now = timezone.now()
    bob = a_researcher("bob")
    # ada held 2 of 4 CPUs from 3 h to 2 h ago; bob held 1 CPU for an hour, until a minute ago.
    old = launch(experiment, researcher, resources=cpus(2))
    held_between(old, now - timedelta(hours=3), now - timedelta(hours=2))
    recent = launch(experiment, bob, resources=cpus(1))
    held_between(recent, now - timedelta(minutes=61), now - timedelta(minutes=1))
    usage = usage_by_owner(holdings(now - timedelta(hours=8)), {"CPU": 4.0, "GPU": 0.0}, now, HOUR)
    ada_usage = 0.5 * HOUR / math.log(2) * (2**-2 - 2**-3)  # 325 share-seconds
    bob_usage = 0.25 * HOUR / math.log(2) * (2 ** (-1 / 60) - 2 ** (-61 / 60))  # 644 share-seconds
    assert usage[str(researcher.pk)] == pytest.approx(ada_usage, rel=1e-3)
    assert usage[str(bob.pk)] == pytest.approx(bob_usage, rel=1e-3)

    # bob's run waits longer, but ada's decayed usage is the smaller: hers starts first.
    bobs = launch(experiment, bob)
    adas = launch(experiment, researcher)
    assert runs_admit(cluster=cluster(4.0, free=1.0), jobs=FakeJobs(), now=now) == [str(adas.pk)]
    bobs.refresh_from_db()
    assert bobs.queue_position == 1

    # A weight of 3 on bob's quota divides his usage by 3 (216 < 325): his goes first now.
    Run.objects.filter(pk=adas.pk).update(state=S.QUEUED)
    Quota.objects.create(user=bob, weight=3.0)
    assert runs_admit(cluster=cluster(4.0, free=1.0), jobs=FakeJobs(), now=now) == [str(bobs.pk)]


def test_a_run_that_fits_the_clusters_total_but_no_node_is_not_admitted(experiment, researcher):
    two_halves = ClusterView(
        [ClusterNode(f"n{i}", f"10.0.0.{i}", {"CPU": 2.0, "GPU": 0.0}, {"CPU": 1.0, "GPU": 0.0}) for i in range(2)]
    )
    run = launch(experiment, researcher, resources=cpus(2))
    assert runs_admit(cluster=lambda: two_halves, jobs=FakeJobs()) == []
    run.refresh_from_db()
    assert run.queue_reason == "fits the cluster's total but no node has 2 CPUs free (the most on one node: 1 CPU)"


def test_an_admitted_run_is_placed_on_a_node_and_that_node_counts_it(experiment, researcher):
    view = ClusterView(
        [ClusterNode(f"n{i}", f"10.0.0.{i}", {"CPU": 2.0, "GPU": 0.0}, {"CPU": 2.0, "GPU": 0.0}) for i in range(2)]
    )
    first, second = (
        launch(experiment, researcher, resources=cpus(2)),
        launch(experiment, researcher, resources=cpus(2)),
    )
    assert runs_admit(cluster=lambda: view, jobs=FakeJobs()) == [str(first.pk), str(second.pk)]
    first.refresh_from_db()
    second.refresh_from_db()
    assert {**first.placement, **second.placement} == {"n0": {"CPU": 2.0, "GPU": 0.0}, "n1": {"CPU": 2.0, "GPU": 0.0}}
    third = launch(experiment, researcher, resources=cpus(1))
    assert runs_admit(cluster=lambda: view, jobs=FakeJobs()) == []  # Ray's report lags: the grants count
    third.refresh_from_db()
    assert third.queue_reason == "needs 1 CPU, 0 free"


def test_a_team_within_its_quota_takes_back_what_another_team_borrowed(experiment, researcher):
    lab_a, lab_b = Group.objects.create(name="lab-a"), Group.objects.create(name="lab-b")
    Quota.objects.create(group=lab_a, max_cpus=1, borrowing=True)
    Quota.objects.create(group=lab_b, max_cpus=1, borrowing=True)
    bob = a_researcher("bob")
    researcher.groups.add(lab_a)
    bob.groups.add(lab_b)
    first, borrowed = launch(experiment, researcher), launch(experiment, researcher)
    jobs = FakeJobs()
    # lab-b is idle: lab-a borrows its CPU (a lending quota is a guarantee, not a cap).
    assert runs_admit(cluster=cluster(2.0), jobs=jobs) == [str(first.pk), str(borrowed.pk)]
    Run.objects.filter(pk__in=[first.pk, borrowed.pk]).update(state=S.RUNNING)

    bobs = launch(experiment, bob)  # the same priority: only the quota gives it a claim
    assert runs_admit(cluster=cluster(2.0, free=0.0), jobs=jobs) == []
    assert (state(first), state(borrowed)) == (S.RUNNING, S.PREEMPTING)
    assert "its team lab-b takes back the quota this run borrowed" in borrowed.transitions.last().reason
    assert Preemption.objects.get(run=borrowed).settled_at is None
    bobs.refresh_from_db()
    assert bobs.queue_reason.endswith("preempting lower-priority runs to make room")


def test_the_snapshot_shows_the_room_left_after_the_grants_and_the_reconcile_refreshes_it(experiment, researcher):
    launch(experiment, researcher)
    runs_admit(cluster=cluster(2.0), jobs=FakeJobs())  # Ray still reports both CPUs free
    snapshot = ClusterSnapshot.objects.get()
    assert snapshot.free == {"CPU": 1.0, "GPU": 0.0} and snapshot.nodes[0]["free"]["CPU"] == 1.0
    first_seen = snapshot.taken_at

    services.runs_reconcile(jobs=FakeJobs(), cluster=cluster(2.0))  # nobody waits: the cluster is read all the same
    snapshot.refresh_from_db()
    assert snapshot.taken_at > first_seen
    assert ClusterSample.objects.count() == 2 and ClusterSample.objects.last().granted == {"CPU": 1.0, "GPU": 0.0}


def test_a_waiting_run_is_expected_to_start_when_the_running_run_of_its_pace_ends(experiment, researcher):
    now = timezone.now()
    launch(
        experiment,
        researcher,
        state=S.RUNNING,
        resources=cpus(2),
        started_at=now - timedelta(seconds=30),
        last_step=1,  # 30 s a step; the test config has 2 steps: 30 s to go
    )
    waiting = launch(experiment, researcher)
    runs_admit(cluster=cluster(2.0, free=0.0), jobs=FakeJobs(), now=now)
    waiting.refresh_from_db()
    assert waiting.queue_estimated_start == now + timedelta(seconds=30)


# --- the preemption deadline ---------------------------------------------------------------------------


def stored_steps(run: Run) -> list[int]:
    return sorted(MetricRow.objects.filter(run=run).values_list("step", flat=True))


def test_the_preemption_deadline_stops_the_job_and_the_run_resumes_from_its_last_checkpoint(
    experiment, researcher, settings, storage
):
    settings.SCHEDULER_PREEMPT_GRACE_S = 300
    run = launch(experiment, researcher, state=S.RUNNING, priority="low")
    events_ingest(
        run.pk,
        parse_batch(
            {"events": [event(run, step, "metrics", step, {"reward/mean": 0.1 * step}) for step in range(1, 8)]},
            str(run.pk),
        ),
    )
    folder = Path(run.resolved_config["logging"]["run_dir"]) / "checkpoints" / "step_5"
    folder.mkdir(parents=True)  # its last checkpoint: steps 6 and 7 come after it
    launch(experiment, researcher, priority="high")
    jobs = FakeJobs()
    runs_admit(cluster=cluster(1.0), jobs=jobs)
    assert state(run) == S.PREEMPTING
    jobs.statuses[run.ray_job_id] = "RUNNING"

    services.run_reconcile(run, jobs=jobs)  # within the grace: asked again, not stopped
    assert jobs.stopped == [] and state(run) == S.PREEMPTING
    Run.objects.filter(pk=run.pk).update(state_changed_at=timezone.now() - timedelta(seconds=301))
    services.run_reconcile(run, jobs=jobs)  # past it: its job is stopped
    assert jobs.stopped == [run.ray_job_id]

    # The engine, killed mid-step, may still report a failure: the run is not failed for it.
    events_ingest(
        run.pk,
        parse_batch({"events": [event(run, 8, "status", 7, {"state": "failed", "reason": "killed"})]}, str(run.pk)),
    )
    assert state(run) == S.PREEMPTING
    services.run_reconcile(run, jobs=jobs)  # the job has stopped
    run.refresh_from_db()
    assert run.state == S.PREEMPTED and run.lost_steps == 2 and run.last_step == 5
    assert run.state_reason == (
        "preempted: still running 300 s after the request (scheduler.preempt_grace_s), so its job was stopped; "
        "resumes after step 5, 2 steps lost"
    )
    assert stored_steps(run) == [1, 2, 3, 4, 5], "the lost steps are rewound: the resumed run records them again"
    assert run.summary["reward/mean"]["step"] == 5 and run.summary["reward/mean"]["count"] == 5
    record = Preemption.objects.get(run=run)
    assert (record.forced, record.step, record.resumed_step, record.lost_steps) == (True, 7, 5, 2)

    from workers.ray_jobs import entrypoint

    Run.objects.filter(priority="high").update(state=S.SUCCEEDED)
    assert runs_admit(cluster=cluster(1.0), jobs=jobs) == [str(run.pk)]
    run.refresh_from_db()
    assert run.attempt == 1 and entrypoint(run, storage / "config.yaml").endswith(f"--resume {folder}")


def test_a_preempted_runs_expected_length_comes_from_the_pace_of_its_last_attempt(experiment, researcher):
    from posttrain.scheduling.durations import expected_length

    now = timezone.now()
    run = launch(experiment, researcher, state=S.PREEMPTED, attempt=1, last_step=8, total_steps=20)
    # Its first attempt reached step 4 and was preempted; the second ran steps 5-8 in 40 s, then was preempted.
    Preemption.objects.create(run=run, resumed_step=4, step=4, settled_at=now - timedelta(seconds=100))
    Run.objects.filter(pk=run.pk).update(
        started_at=now - timedelta(seconds=50), state_changed_at=now - timedelta(seconds=10)
    )
    Preemption.objects.create(run=run, resumed_step=8, step=8, settled_at=now - timedelta(seconds=10))
    run.refresh_from_db()
    assert expected_length(run, experiment_pace=None) == pytest.approx(12 * 10.0)  # 12 steps left, 10 s a step
