"""A review judge on the real stack (uvicorn, a Celery worker consuming the `user_code` queue, Postgres,
Redis): the web request only records the judge run; the worker scores the campaign's items with the
registered reward (python code in the engine's sandbox) and the page's API reads the result back. A worker
that consumes only Celery's default queue never sees the task: it is routed by name to `user_code`."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests

from posttrain.accounts.services import user_create
from posttrain.review import services as review
from posttrain.review.models import JudgeScore
from rl_engine import sandbox
from tests.support.stack import PlatformStack, free_port, platform_stack, postgres_url
from tests.unit.platform.helpers import PASSWORD, default_project, run_with_samples, sample

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.usefixtures("no_dispatch")]

# Passes a response that says "four", in the verl shape: user code the web process never runs.
JUDGE_SOURCE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if "four" in solution_str else 0.0
"""
WAIT_S = 120


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[PlatformStack]:
    from django.db import connection

    no_ray = f"http://127.0.0.1:{free_port()}"  # judges need no Ray
    home = tmp_path_factory.mktemp("judge-stack")
    with platform_stack(no_ray, home, postgres_url(connection.settings_dict)) as s:
        yield s


@pytest.fixture
def session(stack, researcher) -> requests.Session:
    from rest_framework.authtoken.models import Token

    session = requests.Session()
    session.headers["Authorization"] = f"Token {Token.objects.create(user=researcher).key}"
    return session


def wait_done(session: requests.Session, url: str) -> dict:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        judge = session.get(url, timeout=10).json()
        if judge["state"] in ("done", "failed"):
            return judge
        time.sleep(0.5)
    pytest.fail(f"the judge run did not finish within {WAIT_S}s: {judge}")


@pytest.mark.skipif(not sandbox.status().available, reason=f"no sandbox here: {sandbox.status().detail}")
def test_a_python_judge_scores_a_campaign_on_the_user_code_worker(stack, session, experiment, researcher):
    base = stack.web.url
    created = session.post(
        f"{base}/api/rewards/",
        json={"name": "says four", "kind": "python", "source": JUDGE_SOURCE, "spec": {"timeout_s": 30}},
        timeout=120,
    )
    assert created.status_code == 201, created.text
    run = run_with_samples(
        experiment,
        {1: [sample(0, 1.0, "2+2=", "four"), sample(1, 1.0, "2+2=", "five"), sample(2, 0.0, "3+1=", "it is four")]},
    )
    annotator = user_create("ann", PASSWORD, "annotator")
    campaign = review.campaign_create(
        name="judged",
        kind="single",
        questions=[{"key": "correct", "kind": "pass_fail", "label": "Correct?"}],
        source={"runs": [str(run.id)], "rule": "random", "k": 3},
        annotators=[annotator],
        project=default_project(),
        user=researcher,
    )
    started = session.post(
        f"{base}/api/review/campaigns/{campaign.pk}/judges/", json={"reward": created.json()["id"]}, timeout=10
    )
    assert started.status_code == 202, started.text
    judge = wait_done(session, f"{base}/api/review/judge-runs/{started.json()['id']}/")
    assert (judge["state"], judge["scored"], judge["failed_samples"], judge["error"]) == ("done", 3, 0, "")
    scores = {
        score.rollout.response: score.score
        for score in JudgeScore.objects.filter(judge_run_id=judge["id"]).select_related("rollout")
    }
    assert scores == {"four": 1.0, "five": 0.0, "it is four": 1.0}
    assert "workers.review_judge_run" in stack.worker_log.read_text()  # the worker ran it, not the web
