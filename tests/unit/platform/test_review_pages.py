"""The review pages: who may open them (researchers manage campaigns, annotators work their queue, admins
both), the nav links each role sees, and what the annotator's work page embeds."""

from __future__ import annotations

import json

import pytest

from tests.unit.platform.helpers import run_with_samples, sample, single_campaign

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]

RESEARCHER_PAGES = ["/review/", "/review/new/", "/review/campaigns/{id}/"]
ANNOTATOR_PAGES = ["/annotate/", "/annotate/{id}/"]


@pytest.fixture
def annotator(make_user):
    return make_user("annotator", "ann")


@pytest.fixture
def admin(make_user):
    return make_user("admin", "root")


@pytest.fixture
def campaign(experiment, annotator, admin):
    run = run_with_samples(
        experiment, {1: [sample(0, 1.0, "2+2=", "4"), sample(1, 0.0, "3+4=", "8")]}, name="secret-run-name"
    )
    return single_campaign([run], [annotator, admin], k=2)


def signed_in(client, user):
    client.force_login(user)
    return client


@pytest.mark.parametrize("path", RESEARCHER_PAGES + ANNOTATOR_PAGES)
def test_review_pages_send_anonymous_visitors_to_the_login_page(client, campaign, path):
    response = client.get(path.format(id=campaign.pk))
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


@pytest.mark.parametrize("path", RESEARCHER_PAGES)
def test_researcher_pages_refuse_annotators(client, annotator, campaign, path):
    assert signed_in(client, annotator).get(path.format(id=campaign.pk)).status_code == 403


@pytest.mark.parametrize("path", ANNOTATOR_PAGES)
def test_annotator_pages_refuse_researchers(client, researcher, campaign, path):
    assert signed_in(client, researcher).get(path.format(id=campaign.pk)).status_code == 403


@pytest.mark.parametrize("path", RESEARCHER_PAGES)
def test_researcher_pages_open_for_researchers_and_admins(client, researcher, admin, campaign, path):
    assert signed_in(client, researcher).get(path.format(id=campaign.pk)).status_code == 200
    assert signed_in(client, admin).get(path.format(id=campaign.pk)).status_code == 200


@pytest.mark.parametrize("path", ANNOTATOR_PAGES)
def test_annotator_pages_open_for_assigned_annotators_and_admins(client, annotator, admin, campaign, path):
    assert signed_in(client, annotator).get(path.format(id=campaign.pk)).status_code == 200
    assert signed_in(client, admin).get(path.format(id=campaign.pk)).status_code == 200


def test_the_work_page_of_a_campaign_the_annotator_is_not_assigned_to_does_not_exist(client, make_user, campaign):
    stranger = make_user("annotator", "stranger")
    assert signed_in(client, stranger).get(f"/annotate/{campaign.pk}/").status_code == 404


def test_the_campaign_page_of_an_unknown_campaign_is_a_404(client, researcher):
    assert signed_in(client, researcher).get("/review/campaigns/999999/").status_code == 404


def embedded_campaign(response) -> dict:
    html = response.content.decode()
    start = html.index('<script id="campaign-data" type="application/json">') + len(
        '<script id="campaign-data" type="application/json">'
    )
    return json.loads(html[start : html.index("</script>", start)])


def test_the_work_page_embeds_the_questions_and_nothing_about_the_runs(client, annotator, campaign):
    response = signed_in(client, annotator).get(f"/annotate/{campaign.pk}/")
    html = response.content.decode()
    data = embedded_campaign(response)
    assert data == {
        "id": campaign.pk,
        "name": "review",
        "instructions": "",
        "instructions_html": "",
        "kind": "single",
        "blind": True,
        "questions": [{**q, "help_html": "", "rubric_html": []} for q in campaign.questions],
        "state": "active",
    }
    run_id = campaign.source["runs"][0]
    assert "secret-run-name" not in html and run_id not in html


def test_the_nav_shows_each_role_its_review_pages(client, researcher, annotator, admin):
    def nav_links(user) -> set[str]:
        html = signed_in(client, user).get("/").content.decode()
        nav = html[html.index("<nav>") : html.index("</nav>")]
        return {label for label in ("Review", "Annotate") if f">{label}</a>" in nav}

    assert nav_links(researcher) == {"Review"}
    assert nav_links(annotator) == {"Annotate"}
    assert nav_links(admin) == {"Review", "Annotate"}


def test_the_home_page_points_annotators_to_their_queue(client, annotator):
    html = signed_in(client, annotator).get("/").content.decode()
    assert 'href="/annotate/">Your review queue</a>' in html
