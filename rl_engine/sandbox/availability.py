"""Whether a sandbox can be made here (probed at most once a minute) and which of the kernel's limits it gets;
the refusal, or the admin's override, where none can be made; and the gate a run with user code passes before
it starts."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rl_engine.sandbox import seccomp as sandbox_seccomp
from rl_engine.sandbox.bwrap import _bwrap, python_runtime
from rl_engine.sandbox.launch import _cgroup_plan, _popen
from rl_engine.sandbox.policy import (
    _INSTALL_HINT,
    ALLOW_UNSANDBOXED_ENV,
    BWRAP_ENV,
    PROBE_TTL_S,
    Limits,
    SandboxUnavailable,
    sandbox_env,
    unsandboxed_allowed,
)

if TYPE_CHECKING:
    from posttrain_sdk.event_log import EventLog
    from rl_engine.config import RunConfig


@dataclass(frozen=True)
class SandboxStatus:
    available: bool
    detail: str  # the bwrap version, or why no sandbox can be made
    unsandboxed_allowed: bool
    limits: str = ""  # the kernel's limits a sandbox gets here (cgroups, seccomp, keyring)
    warnings: tuple[str, ...] = ()  # the limits that cannot be enforced here, each with why


def status() -> SandboxStatus:
    """Whether a sandbox can be made here (probed at most once a minute: it starts `true` in one), and which
    of the kernel's limits it gets."""
    limits, warnings = kernel_limits()
    return SandboxStatus(*_probe(_bwrap()), unsandboxed_allowed(), limits, warnings)


def kernel_limits() -> tuple[str, tuple[str, ...]]:
    """(what a sandbox gets here, what it does not get and why)."""
    layout = _cgroup_plan()
    seccomp = sandbox_seccomp.seccomp_filter()
    warnings = []
    if layout.missing:
        warnings.append(
            f"sandboxes run without a cgroup limit on {', '.join(layout.missing)}: "
            f"{'; '.join(layout.problems) or 'no cgroup controller for it here'}"
        )
    if seccomp.program is None:
        warnings.append(f"sandboxes run without a seccomp filter: {seccomp.detail}")
    keyring = "a fresh session keyring" if sandbox_seccomp.keyctl_number() is not None else "no keyring change"
    return f"{layout.detail}; {seccomp.detail}; {keyring}", tuple(warnings)


def require() -> bool:
    """True when user code will run sandboxed, False when it may run without (the admin allowed it);
    raises SandboxUnavailable otherwise."""
    current = status()
    if current.available:
        return True
    if current.unsandboxed_allowed:
        return False
    raise SandboxUnavailable(f"user code is not run without a sandbox: {current.detail}; {_INSTALL_HINT}")


def _probe(bwrap: str | None) -> tuple[bool, str]:
    if bwrap is None:
        return False, f"bubblewrap is not installed (no {os.environ.get(BWRAP_ENV) or 'bwrap'} on PATH)"
    return _probe_cached(bwrap)


_probe_lock = threading.Lock()
_probe_results: dict[str, tuple[float, tuple[bool, str]]] = {}


def _probe_cached(bwrap: str) -> tuple[bool, str]:
    with _probe_lock:
        probed = _probe_results.get(bwrap)
        if probed is None or time.monotonic() - probed[0] > PROBE_TTL_S:
            probed = _probe_results[bwrap] = (time.monotonic(), _run_probe(bwrap))
        return probed[1]


def _run_probe(bwrap: str) -> tuple[bool, str]:
    for tool in ("prlimit", "setpriv"):
        if shutil.which(tool, path="/usr/bin:/bin") is None:
            return False, f"{tool} (util-linux) is missing"
    try:
        python_runtime()
    except SandboxUnavailable as exc:
        return False, str(exc)
    try:
        version = subprocess.run([bwrap, "--version"], check=False, capture_output=True, text=True, timeout=10)
        proc = _popen(bwrap, ["/usr/bin/true"], Limits(), sandbox_env({}), {}, {}, ())
        output, _ = proc.communicate(timeout=30)
    except SandboxUnavailable as exc:
        return False, _cannot_sandbox(str(exc))
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"bubblewrap cannot start: {exc}"
    if proc.returncode != 0:
        lines = output.decode(errors="replace").strip().splitlines()
        return False, _cannot_sandbox(lines[-1] if lines else f"exit code {proc.returncode}")
    return True, version.stdout.strip() or "bubblewrap"


def _cannot_sandbox(reason: str) -> str:
    return (
        f"bubblewrap cannot make a sandbox here ({reason}): unprivileged user namespaces may be disabled "
        "(sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone, or a container's seccomp profile)"
    )


# --- the gate a run passes before it starts ---------------------------------------------------


def runs_user_code(cfg: RunConfig) -> bool:
    """Python rewards, an installed package's scoring, an environment or an agent command: code that runs in
    the sandbox."""
    return (
        any(spec.type in ("python", "reasoning_gym", "verifiers") for spec in cfg.rewards)
        or cfg.environment is not None
        or bool(cfg.agent is not None and cfg.agent.command)
    )


def require_sandbox(cfg: RunConfig, sink: EventLog) -> None:
    """A run with user code starts only where a sandbox can be made (SandboxUnavailable says what to
    install), or where an admin allowed unsandboxed code, which the run's log then says."""
    if runs_user_code(cfg) and not require():
        sink.emit(
            "log",
            {
                "level": "warning",
                "message": f"user code runs WITHOUT a sandbox ({ALLOW_UNSANDBOXED_ENV} is set)",
            },
            step=0,
        )
