import pytest
from django.contrib.auth import get_user_model

from tests.support.browser import screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_researcher_logs_in_and_out_in_a_real_browser(web_server, page):
    get_user_model().objects.create_user(username="grace", password="correct-horse-battery")
    page.goto(f"{web_server}/")
    assert page.url.startswith(f"{web_server}/login/")
    page.fill("#id_username", "grace")
    page.fill("#id_password", "correct-horse-battery")
    page.click("button[type=submit]")
    page.wait_for_selector("text=Welcome, grace")
    screenshot(page, "home-after-login")
    # Static files are served by the ASGI app itself (no CDN, no collectstatic).
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(246, 247, 249)"
    page.click("text=Log out")
    page.wait_for_url(f"{web_server}/login/")


def test_a_wrong_password_shows_an_error_in_the_browser(web_server, page):
    get_user_model().objects.create_user(username="linus", password="correct-horse-battery")
    page.goto(f"{web_server}/login/")
    page.fill("#id_username", "linus")
    page.fill("#id_password", "wrong")
    page.click("button[type=submit]")
    assert page.locator("[role=alert]").inner_text().startswith("Your username and password didn't match")


def test_the_api_docs_render_offline_in_the_browser(web_server, page):
    get_user_model().objects.create_user(username="ken", password="correct-horse-battery")
    page.goto(f"{web_server}/login/?next=/api/docs/")
    page.fill("#id_username", "ken")
    page.fill("#id_password", "correct-horse-battery")
    page.click("button[type=submit]")
    page.wait_for_selector("text=/api/health/", timeout=30_000)
    screenshot(page, "api-docs")
