import pytest
from django.urls import reverse

from tests.conftest import free_port

pytestmark = pytest.mark.django_db


def test_health_reports_503_and_names_ray_when_ray_is_unreachable(client, settings):
    settings.RAY_ADDRESS = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    settings.HEALTH_CHECK_TIMEOUT_S = 1
    response = client.get(reverse("api-health"))
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded"
    assert body["checks"]["ray"]["ok"] is False
    assert body["checks"]["database"]["ok"] is True


def test_health_rejects_a_ray_address_that_is_not_the_dashboard_url(client, settings):
    settings.RAY_ADDRESS = "ray://head:10001"
    response = client.get(reverse("api-health"))
    assert response.status_code == 503
    assert "dashboard URL" in response.json()["checks"]["ray"]["detail"]


def test_health_is_readable_without_logging_in(client, settings):
    response = client.get(reverse("api-health"))
    assert response.status_code in (200, 503)
    assert set(response.json()["checks"]) == {"database", "broker", "ray", "sandbox"}


def test_health_shows_the_sandbox_and_whether_an_admin_allowed_code_without_one(client, settings, monkeypatch):
    from rl_engine import sandbox

    body = client.get(reverse("api-health")).json()
    assert body["checks"]["sandbox"]["ok"] is sandbox.status().available
    assert body["unsandboxed_code_allowed"] is False  # off by default

    monkeypatch.setenv("POSTTRAIN_BWRAP", "/nonexistent/bwrap")
    settings.ALLOW_UNSANDBOXED_CODE = True
    body = client.get(reverse("api-health")).json()
    assert body["checks"]["sandbox"]["ok"] is False
    assert "bubblewrap is not installed" in body["checks"]["sandbox"]["detail"]
    assert body["unsandboxed_code_allowed"] is True
