"""Quotas and fair share per project on the database (posttrain.scheduling.services, fair_share, metrics): a project's
quota holds the runs of all its users together, the tightest of the user's and the project's quotas wins, projects
with quotas are teams for fair share and lending, and the queue's metrics show them as projects. A fake cluster
view and Jobs client stand in for Ray."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.utils import timezone

from posttrain.projects.models import Project
from posttrain.runs.models import Run
from posttrain.runs.services.state_machine import S
from posttrain.scheduling.fair_share import fair_share
from posttrain.scheduling.metrics import queue_metrics
from posttrain.scheduling.models import Preemption, Quota
from posttrain.scheduling.prometheus import exposition
from posttrain.scheduling.services import runs_admit
from tests.unit.platform.helpers import (
    FakeJobs,
    a_researcher,
    cluster,
    cpus,
    held_between,
    join,
    launch,
    state,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]

HOUR = 3600.0


def a_project(name: str, *members) -> Project:
    project = Project.objects.create(name=name)
    for user in members:
        join(user, "member", project)
    return project


def reason(run: Run) -> str:
    run.refresh_from_db()
    return run.queue_reason


def test_a_project_quota_holds_the_runs_of_all_its_users_together(experiment, researcher):
    bob = a_researcher("bob")
    alpha = a_project("alpha", researcher, bob)
    Quota.objects.create(project=alpha, max_runs=2)
    adas = launch(experiment, researcher, project=alpha)
    bobs = launch(experiment, bob, project=alpha)
    bobs_second = launch(experiment, bob, project=alpha)
    elsewhere = launch(experiment, bob)  # the default project has no quota
    assert set(runs_admit(cluster=cluster(4.0), jobs=FakeJobs())) == {str(adas.pk), str(bobs.pk), str(elsewhere.pk)}
    assert reason(bobs_second) == "over project alpha's quota of 2 concurrent runs"

    Run.objects.filter(pk=adas.pk).update(state=S.SUCCEEDED)  # ada's run ends: bob's second may start
    assert runs_admit(cluster=cluster(4.0), jobs=FakeJobs()) == [str(bobs_second.pk)]


def test_the_tightest_of_the_users_and_the_projects_quotas_wins(experiment, researcher):
    bob = a_researcher("bob")
    alpha = a_project("alpha", researcher, bob)
    Quota.objects.create(project=alpha, max_runs=3, max_cpus=1)
    Quota.objects.create(user=researcher, max_runs=1)
    first, second = launch(experiment, researcher, project=alpha), launch(experiment, researcher, project=alpha)
    too_big = launch(experiment, bob, project=alpha, resources=cpus(2))
    bobs = launch(experiment, bob, project=alpha)
    assert runs_admit(cluster=cluster(4.0), jobs=FakeJobs()) == [str(first.pk)]
    assert reason(second) == "over your quota of 1 concurrent run"  # ada's own quota is the tighter
    assert reason(bobs) == "over project alpha's quota of 1 CPUs (1 in use)"  # the project's is bob's tighter
    assert reason(too_big) == "can never start as it is: needs 2 CPUs, more than project alpha's quota of 1"


def test_fair_share_between_two_projects_follows_their_weights(experiment, researcher, settings):
    settings.SCHEDULER_USAGE_HALF_LIFE_S = HOUR
    now = timezone.now()
    bob, cy = a_researcher("bob"), a_researcher("cy")
    alpha, beta = a_project("alpha", researcher, cy), a_project("beta", bob, cy)
    alpha_quota = Quota.objects.create(project=alpha)
    Quota.objects.create(project=beta)
    # alpha used 1 of 4 CPUs for an hour until a minute ago (644 share-seconds), beta 2 of 4 from 3 h to 2 h ago (325).
    alphas = launch(experiment, researcher, project=alpha, resources=cpus(1))
    held_between(alphas, now - timedelta(minutes=61), now - timedelta(minutes=1))
    held_between(
        launch(experiment, bob, project=beta, resources=cpus(2)), now - timedelta(hours=3), now - timedelta(hours=2)
    )
    # cy waits with one run in each project: only the projects' shares tell them apart.
    in_alpha = launch(experiment, cy, project=alpha)
    in_beta = launch(experiment, cy, project=beta)
    assert runs_admit(cluster=cluster(4.0, free=1.0), jobs=FakeJobs(), now=now) == [str(in_beta.pk)]

    Run.objects.filter(pk=in_beta.pk).update(state=S.QUEUED)
    Quota.objects.filter(pk=alpha_quota.pk).update(weight=3.0)  # 644 / 3 = 215 < 325: alpha's turn
    assert runs_admit(cluster=cluster(4.0, free=1.0), jobs=FakeJobs(), now=now) == [str(in_alpha.pk)]

    figures = queue_metrics(now=now)
    assert [(row["name"], row["weight_share"]) for row in figures["shares"]["projects"]] == [
        ("alpha", 0.75),
        ("beta", 0.25),
    ]
    assert figures["shares"]["teams"] == []  # no group has a quota
    text = exposition(figures).decode()
    assert 'posttrain_fair_share_ratio{kind="project",name="alpha",of="weight"} 0.75' in text


def test_the_shares_name_only_the_projects_the_viewer_reads(experiment, researcher):
    bob = a_researcher("bob")
    alpha, secret = a_project("alpha", researcher), a_project("secret", bob)
    Quota.objects.create(project=alpha)
    Quota.objects.create(project=secret)
    now = timezone.now()
    held_between(launch(experiment, researcher, project=alpha), now - timedelta(hours=2), now - timedelta(hours=1))
    held_between(launch(experiment, bob, project=secret), now - timedelta(hours=2), now - timedelta(hours=1))
    seen = queue_metrics(now=now, viewer=researcher)["shares"]["projects"]
    assert [(row["name"], row["share"]) for row in seen] == [("alpha", 0.5)]  # of everyone's usage
    assert {row["name"] for row in queue_metrics(now=now)["shares"]["projects"]} == {"alpha", "secret"}


def test_a_runs_team_is_its_projects_when_both_its_project_and_its_group_have_quotas(experiment, researcher):
    lab = Group.objects.create(name="lab-a")
    researcher.groups.add(lab)
    Quota.objects.create(group=lab)
    alpha = a_project("alpha", researcher)
    Quota.objects.create(project=alpha, weight=2.0)
    _, teams = fair_share([str(researcher.pk)], {"CPU": 4.0, "GPU": 0.0}, timezone.now(), HOUR)
    assert teams.of(str(researcher.pk), "alpha") == "project:alpha"
    assert teams.of(str(researcher.pk), "default") == "group:lab-a"  # a project without a quota: the group's
    assert teams.weight == {"project:alpha": 2.0, "group:lab-a": 1.0}


def test_a_project_within_its_lending_quota_takes_back_what_another_project_borrowed(experiment, researcher):
    bob = a_researcher("bob")
    alpha, beta = a_project("alpha", researcher), a_project("beta", bob)
    Quota.objects.create(project=alpha, max_cpus=1, borrowing=True)
    Quota.objects.create(project=beta, max_cpus=1, borrowing=True)
    first = launch(experiment, researcher, project=alpha)
    borrowed = launch(experiment, researcher, project=alpha)
    jobs = FakeJobs()
    # beta is idle: alpha borrows its CPU (a lending quota is a guarantee, not a cap).
    assert runs_admit(cluster=cluster(2.0), jobs=jobs) == [str(first.pk), str(borrowed.pk)]
    Run.objects.filter(pk__in=[first.pk, borrowed.pk]).update(state=S.RUNNING)

    bobs = launch(experiment, bob, project=beta, name="beta-secret-run")  # the same priority: only the quota counts
    assert runs_admit(cluster=cluster(2.0, free=0.0), jobs=jobs) == []
    assert (state(first), state(borrowed)) == (S.RUNNING, S.PREEMPTING)
    why = borrowed.transitions.last().reason
    # alpha's readers learn why, but not the name of beta or of its run (as on the queue).
    assert why == "preempted for a run of another project: its project takes back the quota this run borrowed"
    assert Preemption.objects.get(run=borrowed).reason == why
    assert reason(bobs).endswith("preempting lower-priority runs to make room")


def test_admins_set_project_quotas_in_the_admin_where_projects_are_their_own_kind(admin_client, researcher):
    alpha = a_project("alpha")
    Quota.objects.create(project=alpha, max_runs=2, borrowing=True)
    Quota.objects.create(user=researcher, max_runs=1)
    listed = admin_client.get("/admin/scheduling/quota/?kind=project").content.decode()
    assert "quota of project alpha" in listed and "quota of user ada" not in listed
    assert admin_client.get("/admin/scheduling/quota/add/").content.decode().count('id="id_project"') == 1
    with pytest.raises(ValidationError, match="only a group's or a project's quota lends and borrows"):
        Quota(user=a_researcher("bob"), borrowing=True).full_clean()
