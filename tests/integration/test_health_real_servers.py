"""Health against the real servers: Postgres, the Redis broker and a real Ray head."""

import os

import pytest
from django.db import connection
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_health_is_ok_with_postgres_redis_and_a_ray_head(client, settings, ray_head):
    if connection.vendor != "postgresql" or not os.environ.get("REDIS_URL"):
        pytest.fail("the integration suite needs DATABASE_URL (Postgres) and REDIS_URL; run it with `make test`")
    settings.CELERY_BROKER_URL = os.environ["REDIS_URL"]
    settings.RAY_ADDRESS = ray_head
    response = client.get(reverse("api-health"))
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok"
    assert body["checks"]["database"]["detail"] == "postgresql"
    assert body["checks"]["broker"]["detail"].startswith("redis://")
    assert body["checks"]["ray"]["detail"].startswith("ray 2.")


def test_health_names_the_broker_when_redis_is_unreachable(client, settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    settings.HEALTH_CHECK_TIMEOUT_S = 1
    response = client.get(reverse("api-health"))
    assert response.status_code == 503
    assert response.json()["checks"]["broker"]["ok"] is False
