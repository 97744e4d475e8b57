"""Health against the real servers: Postgres, the Redis broker and a real Ray head."""

import os

import pytest
from django.db import connection
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_health_is_ok_with_postgres_redis_and_a_ray_head(client, admin_client, settings, ray_head):
    if connection.vendor != "postgresql" or not os.environ.get("REDIS_URL"):
        pytest.fail("the integration suite needs DATABASE_URL (Postgres) and REDIS_URL; run it with `make test`")
    settings.CELERY_BROKER_URL = os.environ["REDIS_URL"]
    settings.RAY_ADDRESS = ray_head
    response = admin_client.get(reverse("api-health"))  # a superuser: an admin, who reads the details
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok"
    assert body["checks"]["database"]["detail"] == "postgresql"
    assert body["checks"]["broker"]["detail"].startswith("redis://")
    assert body["checks"]["ray"]["detail"].startswith("ray 2.")

    anonymous = client.get(reverse("api-health"))
    assert anonymous.status_code == 200
    assert {name: set(check) for name, check in anonymous.json()["checks"].items()} == {
        name: {"ok", "latency_ms"} for name in ("database", "broker", "ray", "sandbox", "sandbox_limits")
    }
    assert "redis" not in anonymous.content.decode() and "ray 2." not in anonymous.content.decode()


def test_health_names_the_broker_when_redis_is_unreachable(admin_client, settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    settings.HEALTH_CHECK_TIMEOUT_S = 1
    response = admin_client.get(reverse("api-health"))
    assert response.status_code == 503
    assert response.json()["checks"]["broker"]["ok"] is False
