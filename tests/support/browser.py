"""Helpers of the browser (e2e) tests that are not fixtures: screenshots, signing in, opening a page once its
script is ready. The fixtures (the web server, Chromium, a page) are tests/e2e/conftest.py's."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from tests.support.stack import REPO_ROOT

SCREENSHOTS = REPO_ROOT / "test-artifacts" / "screenshots"


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


PASSWORD = "correct-horse-battery"  # every e2e user's password


def log_in(page, base: str, username: str, next_path: str = "/") -> None:
    page.goto(f"{base}/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}{next_path}")


def open_ready(page, url: str) -> None:
    """Opens a page and waits until its script has loaded what it shows (pages set body[data-ready])."""
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]")


def open_run_page(page, web_server: str, run) -> None:
    """Signs in as the fixtures' researcher and opens the run's page, ready."""
    from tests.unit.platform.helpers import PASSWORD as RESEARCHER_PASSWORD  # "ada"'s, not the e2e users'

    page.goto(f"{web_server}/login/?next={quote(f'/runs/{run.id}/')}")
    page.fill("#id_username", "ada")
    page.fill("#id_password", RESEARCHER_PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{web_server}/runs/{run.id}/")
    page.wait_for_selector("body[data-ready=true]")
