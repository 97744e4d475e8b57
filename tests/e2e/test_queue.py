"""The queue page in a real browser: waiting runs in order with why they wait, running runs with their
grants and the cluster's nodes, updated live as admission moves runs (no reload)."""

from __future__ import annotations

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from tests.e2e.helpers import a_researcher, a_run, an_experiment
from tests.support.browser import log_in, screenshot
from tests.unit.platform.helpers import a_full_one_cpu_cluster, join

pytestmark = pytest.mark.django_db(transaction=True)

ONE_CPU = {"driver": {"CPU": 1.0, "GPU": 0.0}, "bundles": [], "total": {"CPU": 1.0, "GPU": 0.0}}


def test_the_queue_page_shows_who_waits_and_why_and_follows_admission_live(web_server, page):
    from posttrain.runs.services import run_transition

    owner = a_researcher("grace")
    experiment = an_experiment("gsm queue")
    running = a_run(experiment, "holding", "running", resources=ONE_CPU, created_by=owner)
    first = a_run(
        experiment,
        "next",
        "queued",
        resources=ONE_CPU,
        created_by=owner,
        priority="high",
        queue_position=1,
        queue_reason="needs 1 CPU, 0 free",
    )
    second = a_run(
        experiment, "after", "queued", resources=ONE_CPU, created_by=owner, queue_position=2, queue_reason="1 run ahead"
    )
    a_full_one_cpu_cluster(taken_at=timezone.now())
    log_in(page, web_server, "grace", next_path="/queue/")
    waiting = page.locator("#waiting-table tbody tr")
    expect(waiting).to_have_count(2)
    expect(waiting.nth(0)).to_contain_text("next")
    expect(waiting.nth(0).locator(".queue-reason")).to_have_text("needs 1 CPU, 0 free")
    expect(waiting.nth(1).locator(".queue-reason")).to_have_text("1 run ahead")
    expect(page.locator(f'#running-table tr[data-run-id="{running.id}"]')).to_contain_text("1 CPU")
    expect(page.locator("#nodes-table tbody")).to_contain_text("0 / 1")
    screenshot(page, "queue")

    # The running run ends and admission starts the next one: the page follows without a reload.
    from posttrain.runs.models import Run

    assert run_transition(running.id, ["running"], "succeeded", "done")
    assert run_transition(first.id, ["queued"], "starting", "admitted: granted 1 CPU")
    Run.objects.filter(pk=first.pk).update(queue_position=None, queue_reason="")
    Run.objects.filter(pk=second.pk).update(queue_position=1, queue_reason="needs 1 CPU, 0 free")
    expect(waiting).to_have_count(1)
    expect(waiting.nth(0)).to_contain_text("after")
    expect(waiting.nth(0).locator(".queue-position")).to_have_text("1")
    expect(page.locator(f'#running-table tr[data-run-id="{first.id}"]')).to_contain_text("starting")


def test_the_queue_page_draws_utilisation_waits_and_shares(web_server, page):
    from datetime import timedelta

    from posttrain.runs.models import RunTransition
    from posttrain.scheduling.models import ClusterSample, Preemption, Quota

    owner = a_researcher("grace")
    experiment = an_experiment("gsm metrics")
    now = timezone.now()
    run = a_run(experiment, "waited", "running", resources=ONE_CPU, created_by=owner, priority="high")
    RunTransition.objects.filter(run=run).delete()
    for old, new, ago in (("draft", "queued", 600), ("queued", "starting", 540), ("starting", "running", 530)):
        row = RunTransition.objects.create(run=run, from_state=old, to_state=new)
        RunTransition.objects.filter(pk=row.pk).update(at=now - timedelta(seconds=ago))
    Preemption.objects.create(run=run, forced=True, lost_steps=4, settled_at=now)
    Quota.objects.create(project=run.project)  # its project is a team: the projects' chart shows it to its members
    join(owner, "member", run.project)
    for ago, granted in ((900, 1.0), (300, 2.0)):
        ClusterSample.objects.create(
            at=now - timedelta(seconds=ago),
            total={"CPU": 2.0, "GPU": 0.0},
            granted={"CPU": granted, "GPU": 0.0},
            used={"CPU": granted, "GPU": 0.0},
        )
    log_in(page, web_server, "grace", next_path="/queue/")
    summary = page.locator("#metrics-summary")
    expect(summary).to_contain_text("CPUs granted 75%, used 75%")
    expect(summary).to_contain_text("1 preemptions, 1 stopped at the deadline, 4 steps lost")
    for chart in ("utilisation", "waits", "user-shares", "project-shares"):
        expect(page.locator(f"#chart-{chart} .main-svg").first).to_be_visible()
    expect(page.locator("#chart-waits")).to_contain_text("high")
    expect(page.locator("#chart-project-shares")).to_contain_text(run.project.name)
    screenshot(page, "queue-metrics")
