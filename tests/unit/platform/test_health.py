import re

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from tests.support.stack import free_port

pytestmark = pytest.mark.django_db

CHECKS = {"database", "broker", "ray", "sandbox", "sandbox_limits"}


@pytest.fixture
def admin(client_for) -> APIClient:
    """An admin's session: the health check's details are theirs."""
    return client_for("admin")


def test_health_reports_503_and_names_ray_when_ray_is_unreachable(admin, settings):
    settings.RAY_ADDRESS = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    settings.HEALTH_CHECK_TIMEOUT_S = 1
    response = admin.get(reverse("api-health"))
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded"
    assert body["checks"]["ray"]["ok"] is False
    assert body["checks"]["database"]["ok"] is True


def test_health_rejects_a_ray_address_that_is_not_the_dashboard_url(admin, settings):
    settings.RAY_ADDRESS = "ray://head:10001"
    response = admin.get(reverse("api-health"))
    assert response.status_code == 503
    assert "dashboard URL" in response.json()["checks"]["ray"]["detail"]


def test_health_is_readable_without_logging_in_and_says_only_ok_and_latency(client, settings):
    settings.RAY_ADDRESS = "ray://head:10001"  # a failing check, whose error text an admin would read
    response = client.get(reverse("api-health"))
    assert response.status_code == 503
    body = response.json()
    assert set(body) == {"status", "checks"}
    assert set(body["checks"]) == CHECKS
    for check in body["checks"].values():
        assert set(check) == {"ok", "latency_ms"}
        assert isinstance(check["ok"], bool) and isinstance(check["latency_ms"], float)
    text = response.content.decode()
    assert not re.search(r"://|/[a-z]|sqlite|postgres|redis|ray \d|bwrap|bubblewrap|cgroup", text), text


def test_health_details_are_for_admins_by_session_or_token_and_no_one_else(admin, client_for, make_user, settings):
    from rest_framework.authtoken.models import Token

    settings.RAY_ADDRESS = "ray://head:10001"  # refused at once: no wait on a network that is not there

    assert set(admin.get(reverse("api-health")).json()) == {
        "status",
        "checks",
        "unsandboxed_code_allowed",
        "ray_auth",
        "warnings",
    }
    assert "detail" in admin.get(reverse("api-health")).json()["checks"]["database"]
    by_token = APIClient()
    by_token.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=make_user('admin', 'ops')).key}")
    assert "detail" in by_token.get(reverse("api-health")).json()["checks"]["database"]
    for who in ("researcher", "annotator", "reviewer"):
        assert set(client_for(who).get(reverse("api-health")).json()) == {"status", "checks"}
    stale = APIClient()
    stale.credentials(HTTP_AUTHORIZATION="Token not-a-token")  # a monitor's old token: still answered
    response = stale.get(reverse("api-health"))
    assert response.status_code in (200, 503) and set(response.json()) == {"status", "checks"}


def test_health_shows_the_sandbox_and_whether_an_admin_allowed_code_without_one(admin, settings, monkeypatch):
    from rl_engine import sandbox

    body = admin.get(reverse("api-health")).json()
    assert body["checks"]["sandbox"]["ok"] is sandbox.status().available
    assert body["unsandboxed_code_allowed"] is False  # off by default

    monkeypatch.setenv("POSTTRAIN_BWRAP", "/nonexistent/bwrap")
    settings.ALLOW_UNSANDBOXED_CODE = True
    body = admin.get(reverse("api-health")).json()
    assert body["checks"]["sandbox"]["ok"] is False
    assert "bubblewrap is not installed" in body["checks"]["sandbox"]["detail"]
    assert body["unsandboxed_code_allowed"] is True


def test_health_shows_the_kernel_limits_each_sandbox_gets(admin):
    from rl_engine import sandbox

    limits, warnings = sandbox.kernel_limits()
    body = admin.get(reverse("api-health")).json()
    assert body["checks"]["sandbox_limits"]["ok"] is (not warnings)
    assert body["warnings"] == ([f"user code: {'; '.join(warnings)}"] if warnings else [])
    if not warnings:
        assert body["checks"]["sandbox_limits"]["detail"] == limits
        assert "memory, pids, cpu" in limits and "seccomp filter" in limits and "fresh session keyring" in limits


def test_health_warns_when_sandboxes_cannot_get_a_cgroup_without_counting_it_as_down(admin, monkeypatch):
    from rl_engine.sandbox import availability, launch
    from rl_engine.sandbox import cgroup as sandbox_cgroup

    # A host that offers no cgroup to this process (as a platform not running as root, without a delegated
    # folder; tests/security/test_sandbox_limits.py runs that case for real). Patched where it is looked up:
    # kernel_limits (the status) and _new_cgroup (a sandbox started meanwhile, the probe's).
    nothing = sandbox_cgroup.Plan((), sandbox_cgroup.CONTROLLERS, ("cgroup v1 /sys/fs/cgroup/memory is not writable",))
    monkeypatch.setattr(availability, "_cgroup_plan", lambda: nothing)
    monkeypatch.setattr(launch, "_cgroup_plan", lambda: nothing)
    response = admin.get(reverse("api-health"))
    body = response.json()
    assert body["checks"]["sandbox_limits"]["ok"] is False
    assert "without a cgroup limit on memory, pids, cpu" in body["checks"]["sandbox_limits"]["detail"]
    assert body["warnings"] == [f"user code: {body['checks']['sandbox_limits']['detail']}"]
    assert "not writable" in body["warnings"][0]
    assert (response.status_code == 200) is (body["status"] == "ok")  # the servers decide the status, not this


def test_the_schema_lists_every_check_and_marks_the_details_admins_only(admin):
    components = admin.get("/api/schema/", {"format": "json"}).json()["components"]["schemas"]
    assert set(components["HealthChecks"]["properties"]) == CHECKS == set(components["HealthChecks"]["required"])
    assert set(components["DependencyStatus"]["required"]) == {"ok", "latency_ms"}
    assert set(components["Health"]["required"]) == {"status", "checks"}
    for where in (
        components["DependencyStatus"]["properties"]["detail"],
        components["Health"]["properties"]["warnings"],
    ):
        assert "Admins only" in where["description"]
