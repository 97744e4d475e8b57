"""The fault suite's stack: uvicorn, a Celery worker with beat and the session's Ray head, on the test
database and a private Redis (a test may crash it). Each test injects one fault mid-run and then checks
the invariants of tests/faults/invariants.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.servers import FAULT_STACK_ENV, PrivateRedis
from tests.support.stack import (
    PlatformStack,
    platform_stack,
    postgres_url,
    stop_process_group,
    stop_ray_jobs,
    tiny_demo_assets,
)
from tests.support.stack_fixtures import api, registry  # noqa: F401  (fixtures shared with the lifecycle tests)


@pytest.fixture(scope="package")
def demo_assets(tmp_path_factory) -> Path:
    return tiny_demo_assets(tmp_path_factory, "faults-demo")


@pytest.fixture(scope="package")
def private_redis(tmp_path_factory) -> Iterator[PrivateRedis]:
    redis = PrivateRedis(tmp_path_factory.mktemp("redis"))
    redis.start()
    try:
        yield redis
    finally:
        redis.kill()


@pytest.fixture(scope="package")
def stack(django_db_setup, django_db_blocker, ray_head, private_redis, tmp_path_factory) -> Iterator[PlatformStack]:
    from django.db import connection

    env = {**FAULT_STACK_ENV, "REDIS_URL": private_redis.url, "CELERY_BROKER_URL": private_redis.url}
    home = tmp_path_factory.mktemp("faults-stack")
    with platform_stack(ray_head, home, postgres_url(connection.settings_dict), extra_env=env) as stack:
        original = stack.worker
        try:
            yield stack
        finally:
            if stack.worker is not original:  # a replacement started by a test
                stop_process_group(stack.worker)


@pytest.fixture(autouse=True)
def _after_each_test(stack) -> Iterator[None]:
    """No request may have been a 500 (a fault is answered, never a crash); a failed test must not leave an
    engine running into the next one."""
    yield
    stop_ray_jobs(stack.ray)
    errors = [line for line in stack.web.log().splitlines() if '" 500 ' in line]
    stack.web.log_path.write_text("")
    assert not errors, "\n".join(errors)
