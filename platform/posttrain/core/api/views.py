from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from posttrain.core.selectors import system_health

_dependency = inline_serializer(
    "DependencyStatus",
    fields={
        "ok": serializers.BooleanField(),
        "latency_ms": serializers.FloatField(),
        "detail": serializers.CharField(),
    },
)


_HEALTH = inline_serializer(
    "Health",
    fields={
        "status": serializers.ChoiceField(choices=["ok", "degraded"]),
        "checks": inline_serializer(
            "HealthChecks",
            fields={
                "database": _dependency,
                "broker": _dependency,
                "ray": _dependency,
                "sandbox": _dependency,
                "sandbox_limits": _dependency,
            },
        ),
        "unsandboxed_code_allowed": serializers.BooleanField(),
        "ray_auth": serializers.ChoiceField(choices=["token", "disabled", "unknown"]),
        "warnings": serializers.ListField(child=serializers.CharField()),
    },
)


@extend_schema(
    summary="Reachability of the database, the Celery broker and Ray; the sandbox for user code",
    description="`status` counts the database, the broker and Ray: when one is down the same body comes with a "
    "503 (for load balancers). `checks.sandbox` says whether user code (python rewards, environments, agent "
    "commands) can run in a bubblewrap sandbox on this host; `checks.sandbox_limits` which of the kernel's limits "
    "each sandbox gets (a cgroup for memory, pids and cpu; a seccomp filter; a fresh keyring), failing with what "
    "cannot be enforced here, which `warnings` repeats; `unsandboxed_code_allowed` is the admin's "
    "POSTTRAIN_ALLOW_UNSANDBOXED_CODE (off by default); `ray_auth` the authentication the Ray head says it enforces "
    "(`token`; `disabled`, which `warnings` repeats; `unknown` when it does not answer).",
    responses={(200, "application/json"): _HEALTH},
)
@api_view(["GET"])
@authentication_classes([])
@permission_classes([AllowAny])
def health(request: Request) -> Response:
    """200 when every dependency answers, 503 otherwise (load balancers read the code)."""
    report = system_health()
    return Response(report.as_dict(), status=200 if report.ok else 503)
