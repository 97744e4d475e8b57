"""e2e fixtures: the real ASGI server (uvicorn) on the test database, and Debian's headless Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, VENV_BIN, free_port, stop_process_group, wait_for_http


SCREENSHOTS = REPO_ROOT / "test-artifacts" / "screenshots"
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]


def _database_url(settings_dict: dict) -> str:
    if settings_dict["ENGINE"] != "django.db.backends.postgresql":
        pytest.fail("e2e tests need DATABASE_URL pointing at Postgres (the server reads the test database); use `make test`")
    user = settings_dict.get("USER") or "postgres"
    password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{settings_dict['NAME']}"


@pytest.fixture(scope="session")
def web_server(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[str]:
    """uvicorn serving the app against the test database, as `make demo` serves it."""
    from django.db import connection

    port = free_port()
    home = tmp_path_factory.mktemp("web-home")
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(connection.settings_dict),
        "POSTTRAIN_HOME": str(home),
        "PYTHONUNBUFFERED": "1",
    }
    log = home / "uvicorn.log"
    process = subprocess.Popen(
        [str(VENV_BIN / "uvicorn"), "--app-dir", str(REPO_ROOT / "platform"), "posttrain.asgi:application",
         "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO_ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{url}/login/", timeout_s=60, process=process)
        yield url
    finally:
        stop_process_group(process)
        if process.returncode not in (0, -15, None):
            sys.stderr.write(log.read_text())


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


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
