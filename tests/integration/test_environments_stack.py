"""Installed environments on the real stack (uvicorn, a Celery worker, Postgres, Redis): registering one has the
worker generate its rows in the sandbox, and "Try it" plays an episode on the worker, turn by turn, while the
web server waits."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests

from rl_engine import sandbox
from tests.support.stack import PlatformStack, free_port, platform_stack, postgres_url

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox.status().available, reason=f"no sandbox here: {sandbox.status().detail}"),
]
pytest.importorskip("textarena")


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[PlatformStack]:
    from django.db import connection

    no_ray = f"http://127.0.0.1:{free_port()}"  # environments need no Ray
    with platform_stack(no_ray, tmp_path_factory.mktemp("env-stack"), postgres_url(connection.settings_dict)) as s:
        yield s


@pytest.fixture
def session(stack) -> requests.Session:
    from rest_framework.authtoken.models import Token

    from tests.unit.platform.helpers import a_researcher

    session = requests.Session()
    session.headers["Authorization"] = f"Token {Token.objects.create(user=a_researcher()).key}"
    return session


def test_the_worker_generates_an_environment_and_plays_it_in_try_it(stack, session):
    api = f"{stack.web.url}/api/environments/"
    created = session.post(
        api, json={"name": "guess", "package": "textarena", "env_id": "GuessTheNumber-v0", "size": 3}
    )
    assert created.status_code == 201, created.text
    assert created.json()["state"] == "generating"
    url = f"{api}{created.json()['id']}/"
    deadline = time.monotonic() + 180
    while (body := session.get(url).json())["state"] == "generating":
        assert time.monotonic() < deadline, "the worker did not generate the environment in time"
        time.sleep(0.5)
    assert body["state"] == "ready", body["error"]
    assert body["dataset_name"] == "guess" and body["run_environment"]["package"] == "textarena"

    played = session.post(f"{url}try/", json={"moves": ["[10]", "[5]", "[15]"]}, timeout=120)
    assert played.status_code in (200, 202), played.text
    result = played.json()
    while result.get("state") in ("queued", "running"):
        time.sleep(0.5)
        trial = session.get(f"{stack.web.url}{result['url']}").json()
        result = trial["result"] if trial["state"] == "done" else trial
    assert result["turns"][0] == {"role": "assistant", "text": "[10]", "reward": None}
    assert result["turns"][1]["role"] == "environment" and result["errors"] == []
    assert stack.web.process.poll() is None and stack.worker.poll() is None
