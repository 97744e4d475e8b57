"""Two researchers in two projects and one shared project, side by side in the browser: each sees only the projects
they are in, the switcher narrows every list to one, another project's run page does not exist for them, and a
project's owner adds a member from the projects page."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.e2e.helpers import a_run, an_experiment
from tests.support.browser import PASSWORD, log_in, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def _researcher(username: str):
    from posttrain.accounts.services import user_create

    return user_create(username, PASSWORD, "researcher")


def _lab():
    from posttrain.projects.models import Project
    from posttrain.runs.models import Run
    from tests.unit.platform.helpers import join

    ada, bob = _researcher("ada"), _researcher("bob")
    alpha, beta, shared = (Project.objects.create(name=name) for name in ("alpha", "beta", "shared"))
    join(ada, "owner", alpha)
    join(bob, "owner", beta)
    join(ada, "member", shared)
    join(bob, "member", shared)
    runs = {}
    for project, owner, name in ((alpha, ada, "ada's secret"), (beta, bob, "bob's own"), (shared, ada, "together")):
        experiment = an_experiment(f"{name} exp")
        experiment.project = project
        experiment.created_by = owner
        experiment.save(update_fields=["project", "created_by"])
        run = a_run(experiment, name, "running")
        Run.objects.filter(pk=run.pk).update(project=project, created_by=owner)
        runs[name] = run
    return runs


def run_rows(page):
    return page.locator("#runs-table tbody tr")


def test_two_researchers_share_one_project_and_see_nothing_of_each_others_own(web_server, page, browser):
    runs = _lab()
    log_in(page, web_server, "bob", next_path="/runs/")
    switcher = page.get_by_test_id("project-switcher")
    expect(switcher.locator("option")).to_have_text(["All projects", "beta (owner)", "shared (member)"])
    expect(run_rows(page)).to_have_count(2)
    expect(page.locator("#runs-table")).to_contain_text("bob's own")
    expect(page.locator("#runs-table")).to_contain_text("together")
    expect(page.locator("#runs-table")).not_to_contain_text("ada's secret")

    switcher.select_option(label="shared (member)")
    page.wait_for_load_state("load")
    expect(page.get_by_test_id("project-switcher").locator("option:checked")).to_have_text("shared (member)")
    expect(run_rows(page)).to_have_count(1)
    expect(page.locator("#runs-table")).to_contain_text("together")
    screenshot(page, "projects-switcher-shared")

    # Ada's own project's run does not exist for Bob.
    secret = runs["ada's secret"]
    refused = page.goto(f"{web_server}/runs/{secret.pk}/")
    assert refused is not None and refused.status == 404

    # Bob makes a project and adds Ada to it from the projects page.
    page.goto(f"{web_server}/projects/")
    page.fill("#project-form input[name=name]", "gamma")
    page.click("#project-form button[type=submit]")
    expect(page.locator("#members-project")).to_have_text("gamma")
    page.fill("#member-form input[name=username]", "ada")
    page.select_option("#member-form select[name=role]", "member")
    page.click("#member-form button[type=submit]")
    members = page.get_by_test_id("members-table")
    expect(members.locator('tr[data-member="ada"] select')).to_have_value("member")
    expect(members.locator('tr[data-member="bob"] select')).to_have_value("owner")
    screenshot(page, "projects-page")

    ada_context = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        ada = ada_context.new_page()
        log_in(ada, web_server, "ada", next_path="/runs/")
        ada_switcher = ada.get_by_test_id("project-switcher")
        expect(ada_switcher.locator("option")).to_have_text(
            ["All projects", "alpha (owner)", "gamma (member)", "shared (member)"]
        )
        expect(run_rows(ada)).to_have_count(2)
        expect(ada.locator("#runs-table")).not_to_contain_text("bob's own")
    finally:
        ada_context.close()
