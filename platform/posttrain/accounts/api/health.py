"""The health endpoint (`GET /api/health/`, core's system_health). Here, in accounts, because how much it tells
depends on the caller's role: an admin also gets what each check found."""

from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from posttrain.accounts.roles import Role
from posttrain.accounts.selectors import user_roles
from posttrain.core.selectors import system_health

_ADMINS_ONLY = "Admins only (a signed-in admin's session or an admin's token); absent for everyone else."


def _dependency() -> serializers.Serializer:
    """One check's answer: a new field each time (a DRF field belongs to one parent; a shared one would be
    bound to the last name it was given)."""
    return inline_serializer(
        "DependencyStatus",
        fields={
            "ok": serializers.BooleanField(),
            "latency_ms": serializers.FloatField(),
            "detail": serializers.CharField(
                required=False,
                help_text=f"What the check found (a version, the broker's URI, why it failed). {_ADMINS_ONLY}",
            ),
        },
    )


_HEALTH = inline_serializer(
    "Health",
    fields={
        "status": serializers.ChoiceField(choices=["ok", "degraded"]),
        "checks": inline_serializer(
            "HealthChecks",
            fields={name: _dependency() for name in ("database", "broker", "ray", "sandbox", "sandbox_limits")},
        ),
        "unsandboxed_code_allowed": serializers.BooleanField(required=False, help_text=_ADMINS_ONLY),
        "ray_auth": serializers.ChoiceField(
            choices=["token", "disabled", "unknown"], required=False, help_text=_ADMINS_ONLY
        ),
        "warnings": serializers.ListField(child=serializers.CharField(), required=False, help_text=_ADMINS_ONLY),
    },
)


class _TokenOrAnonymous(TokenAuthentication):
    """A token that does not authenticate is no error here: a monitor with a stale token still gets the
    anonymous answer (a health check is never refused)."""

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        try:
            return super().authenticate(request)
        except AuthenticationFailed:
            return None


@extend_schema(
    summary="Reachability of the database, the Celery broker and Ray; the sandbox for user code",
    description="`status` counts the database, the broker and Ray: when one is down the same body comes with a "
    "503 (for load balancers). Each check says whether it passed (`ok`) and how long it took (`latency_ms`); "
    "anyone may read that much. An admin (signed-in session or token) also gets what each check found "
    "(`detail`: versions, the broker's URI, the sandbox's limits and what is missing), "
    "`unsandboxed_code_allowed`, `ray_auth` and `warnings`; other credentials, valid or not, get the anonymous "
    "answer. `checks.sandbox` says whether user code (python rewards, environments, agent commands) can run in a "
    "bubblewrap sandbox on this host; `checks.sandbox_limits` whether each sandbox gets all of the kernel's "
    "limits (a cgroup for memory, pids and cpu; a seccomp filter; a fresh keyring), which `warnings` says "
    "otherwise; `unsandboxed_code_allowed` is the admin's POSTTRAIN_ALLOW_UNSANDBOXED_CODE (off by default); "
    "`ray_auth` the authentication the Ray head says it enforces (`token`; `disabled`, which `warnings` repeats; "
    "`unknown` when it does not answer).",
    responses={(200, "application/json"): _HEALTH},
)
@api_view(["GET"])
@authentication_classes([SessionAuthentication, _TokenOrAnonymous])
@permission_classes([AllowAny])
def health(request: Request) -> Response:
    """200 when every dependency answers, 503 otherwise (load balancers read the code); details for admins."""
    report = system_health()
    details = Role.ADMIN in user_roles(request.user)
    return Response(report.as_dict(details=details), status=200 if report.ok else 503)
