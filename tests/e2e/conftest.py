"""e2e fixtures: the real ASGI server (uvicorn) on the test database, and Debian's headless Chromium. The
helpers that are not fixtures (signing in, screenshots) are tests/support/browser.py's."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.browser import SCREENSHOTS
from tests.support.stack import UvicornServer, postgres_url

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


@pytest.fixture(scope="session")
def rollout_store(tmp_path_factory) -> Path:
    """The rollout store the web server reads and the tests write runs' rollout files into (as an engine
    would): one folder for the session, each run in its own `runs/<id>/rollouts/`."""
    return tmp_path_factory.mktemp("rollout-store")


@pytest.fixture(scope="session")
def web_storage(tmp_path_factory) -> Path:
    """The web server's artifact root (its datasets' copies): a test that registers files in-process for the
    server to open points its own settings.STORAGE_ROOT here."""
    return tmp_path_factory.mktemp("web-storage")


@pytest.fixture
def storage(storage: Path, settings, rollout_store: Path) -> Path:
    """The test's artifact root, with rollout files going to the web server's store."""
    settings.ROLLOUT_STORE = str(rollout_store)
    return storage


@pytest.fixture(scope="session")
def web_server(django_db_setup, django_db_blocker, tmp_path_factory, rollout_store, web_storage) -> Iterator[str]:
    """uvicorn serving the app against the test database, as `make demo` serves it."""
    from django.db import connection

    home = tmp_path_factory.mktemp("web-home")
    env = {
        **os.environ,
        "DATABASE_URL": postgres_url(connection.settings_dict),
        "POSTTRAIN_HOME": str(home),
        "POSTTRAIN_STORAGE": str(web_storage),
        "POSTTRAIN_ROLLOUT_STORE": str(rollout_store),
        "PYTHONUNBUFFERED": "1",
    }
    server = UvicornServer(env, home / "uvicorn.log")
    server.start()
    try:
        yield server.url
    finally:
        crashed = server.process is not None and server.process.poll() is not None
        server.stop()
        if crashed:
            sys.stderr.write(server.log())


@pytest.fixture(scope="package")
def browser(tmp_path_factory):
    """Package-scoped: Playwright's sync API runs an event loop in this thread while it is open, which
    must end with the e2e tests (asyncio.run elsewhere would refuse to start)."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("Debian chromium is missing; `make test` installs it (scripts/ensure_chromium.sh)")
    # The ORM calls in test set-up stay synchronous while that loop runs; Django's async-safety
    # guard would refuse them, so it is relaxed for the e2e tests only.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_FLAGS)
            yield browser
            browser.close()
    finally:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@pytest.fixture
def page(browser, request):
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    yield page
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{request.node.name}.png"), full_page=True)
    context.close()
