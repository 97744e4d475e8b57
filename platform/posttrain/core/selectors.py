"""Reads of the core app: the health of the servers the platform depends on.

The web process never imports ray: Ray is checked over its HTTP Jobs/dashboard API. Anyone may read whether
each server answers and how fast; what each check found (the broker's URI, versions, the sandbox's limits and
why one is missing, which name the host's paths) is for admins (`HealthReport.as_dict(details=True)`).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass

from django.conf import settings
from django.db import connection
from kombu import Connection

from posttrain.core.ray_auth import DISABLED_WARNING, ray_request, refused_reason
from rl_engine.spec.user_code import sandbox


@dataclass(frozen=True)
class DependencyStatus:
    ok: bool
    latency_ms: float
    detail: str


@dataclass(frozen=True)
class HealthReport:
    database: DependencyStatus
    broker: DependencyStatus
    ray: DependencyStatus
    sandbox: DependencyStatus
    sandbox_limits: DependencyStatus
    unsandboxed_code_allowed: bool
    ray_auth: str = "unknown"  # what the Ray head says it enforces: token, disabled, or unknown (no answer)
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """The servers this web server needs; the sandbox is reported, not counted (workers run user code)."""
        return self.database.ok and self.broker.ok and self.ray.ok

    def as_dict(self, *, details: bool) -> dict:
        """Status, and each check's `ok` and `latency_ms`; with `details` (an admin's view) also each check's
        `detail`, `unsandboxed_code_allowed`, `ray_auth` and `warnings`."""
        checks = {
            "database": self.database,
            "broker": self.broker,
            "ray": self.ray,
            "sandbox": self.sandbox,
            "sandbox_limits": self.sandbox_limits,
        }
        status = "ok" if self.ok else "degraded"
        if not details:
            return {
                "status": status,
                "checks": {name: {"ok": c.ok, "latency_ms": c.latency_ms} for name, c in checks.items()},
            }
        return {
            "status": status,
            "checks": {name: asdict(check) for name, check in checks.items()},
            "unsandboxed_code_allowed": self.unsandboxed_code_allowed,
            "ray_auth": self.ray_auth,
            "warnings": list(self.warnings),
        }


def _timed(check) -> DependencyStatus:
    started = time.perf_counter()
    try:
        detail = check()
        ok = True
    except Exception as exc:  # any failure is a finding to report, not an error of this endpoint
        detail = f"{type(exc).__name__}: {exc}"[:300]
        ok = False
    return DependencyStatus(ok=ok, latency_ms=round((time.perf_counter() - started) * 1000, 1), detail=detail)


def _check_database() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return connection.vendor


def _check_broker() -> str:
    url = settings.CELERY_BROKER_URL
    timeout = settings.HEALTH_CHECK_TIMEOUT_S
    with Connection(url, connect_timeout=timeout, transport_options={"socket_timeout": timeout}) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout)
        return conn.as_uri()  # masks any password


def _ray_dashboard() -> str:
    address = settings.RAY_ADDRESS.rstrip("/")
    if not address.startswith(("http://", "https://")):
        raise ValueError(f"RAY_ADDRESS must be the Ray dashboard URL (http://host:8265), got {address!r}")
    return address


def _check_ray() -> str:
    """Ray's version, asked with the platform's token as every request to Ray is: a token Ray refuses fails it."""
    request = ray_request(f"{_ray_dashboard()}/api/version")
    try:
        with urllib.request.urlopen(request, timeout=settings.HEALTH_CHECK_TIMEOUT_S) as response:
            version = json.load(response)
    except urllib.error.HTTPError as exc:
        raise RuntimeError(refused_reason(exc.code) or f"Ray answered {exc.code}") from None
    return f"ray {version.get('ray_version', '?')}"


def _ray_auth_mode() -> str:
    """The authentication the head enforces, as it says itself (`/api/authentication_mode` needs no token)."""
    try:
        url = f"{_ray_dashboard()}/api/authentication_mode"
        with urllib.request.urlopen(url, timeout=settings.HEALTH_CHECK_TIMEOUT_S) as response:
            return str(json.load(response)["authentication_mode"])
    except Exception:  # Ray down or too old to say: the ray check reports the first, the field says "unknown"
        return "unknown"


def _check_sandbox() -> str:
    """Whether user code can run sandboxed on this host (the workers' and Ray's hosts should match)."""
    status = sandbox.status()
    if not status.available:
        raise RuntimeError(status.detail)
    return status.detail


def _check_sandbox_limits() -> str:
    """The kernel's limits on each sandbox (cgroups, seccomp, keyring); a limit that cannot be made here fails
    the check, naming it and why (the sandbox still runs: a warning, not a refusal)."""
    limits, warnings = sandbox.kernel_limits()
    if warnings:
        raise RuntimeError("; ".join(warnings))
    return limits


def system_health() -> HealthReport:
    sandbox_limits = _timed(_check_sandbox_limits)
    ray_auth = _ray_auth_mode()
    warnings = [] if sandbox_limits.ok else [f"user code: {sandbox_limits.detail}"]
    if ray_auth == "disabled":
        warnings.append(f"ray: {DISABLED_WARNING}")
    return HealthReport(
        database=_timed(_check_database),
        broker=_timed(_check_broker),
        ray=_timed(_check_ray),
        sandbox=_timed(_check_sandbox),
        sandbox_limits=sandbox_limits,
        unsandboxed_code_allowed=settings.ALLOW_UNSANDBOXED_CODE,
        ray_auth=ray_auth,
        warnings=tuple(warnings),
    )
