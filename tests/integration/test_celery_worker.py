"""A real Celery worker (the same command `make demo` runs) over the real Redis broker."""

import os
import platform
import subprocess

import pytest
from celery import Celery

from tests.support.stack import REPO_ROOT, VENV_BIN


@pytest.fixture
def redis_url() -> str:
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.fail("the integration suite needs REDIS_URL; run it with `make test`")
    return url.rsplit("/", 1)[0]


def test_a_task_round_trips_through_redis_and_the_worker_keeps_stdlib_platform(redis_url, tmp_path):
    broker, backend = f"{redis_url}/11", f"{redis_url}/12"
    env = {**os.environ, "CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": backend, "POSTTRAIN_HOME": str(tmp_path)}
    worker = subprocess.Popen(
        [
            str(VENV_BIN / "celery"),
            "-A",
            "workers.celery_app",
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "-Q",
            "celery",
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    client = Celery("test-client", broker=broker, backend=backend)
    try:
        result = client.send_task("workers.ping").get(timeout=90)
    finally:
        worker.terminate()
        output, _ = worker.communicate(timeout=30)
    assert result == {"pong": True, "python": platform.python_version()}, output
