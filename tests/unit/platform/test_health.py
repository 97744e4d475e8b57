import pytest
from django.urls import reverse

from tests.support.stack import free_port

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
    assert set(response.json()["checks"]) == {"database", "broker", "ray", "sandbox", "sandbox_limits"}


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


def test_health_shows_the_kernel_limits_each_sandbox_gets(client):
    from rl_engine import sandbox

    limits, warnings = sandbox.kernel_limits()
    body = client.get(reverse("api-health")).json()
    assert body["checks"]["sandbox_limits"]["ok"] is (not warnings)
    assert body["warnings"] == ([f"user code: {'; '.join(warnings)}"] if warnings else [])
    if not warnings:
        assert body["checks"]["sandbox_limits"]["detail"] == limits
        assert "memory, pids, cpu" in limits and "seccomp filter" in limits and "fresh session keyring" in limits


def test_health_warns_when_sandboxes_cannot_get_a_cgroup_without_counting_it_as_down(client, monkeypatch):
    from rl_engine import sandbox, sandbox_cgroup

    # A host that offers no cgroup to this process (as a platform not running as root, without a delegated
    # folder; tests/security/test_sandbox_limits.py runs that case for real).
    nothing = sandbox_cgroup.Plan((), sandbox_cgroup.CONTROLLERS, ("cgroup v1 /sys/fs/cgroup/memory is not writable",))
    monkeypatch.setattr(sandbox, "_cgroup_plan", lambda: nothing)
    response = client.get(reverse("api-health"))
    body = response.json()
    assert body["checks"]["sandbox_limits"]["ok"] is False
    assert "without a cgroup limit on memory, pids, cpu" in body["checks"]["sandbox_limits"]["detail"]
    assert body["warnings"] == [f"user code: {body['checks']['sandbox_limits']['detail']}"]
    assert "not writable" in body["warnings"][0]
    assert (response.status_code == 200) is (body["status"] == "ok")  # the servers decide the status, not this
