"""Starting a sandbox: the launcher that joins its cgroups and a fresh session keyring and then becomes
bubblewrap, the sandbox's cgroups, and, as root, the uid mapping bubblewrap waits for."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from rl_engine.sandbox import cgroup as sandbox_cgroup
from rl_engine.sandbox import seccomp as sandbox_seccomp
from rl_engine.sandbox.bwrap import _filesystem_args, _namespace_args, _seccomp_args
from rl_engine.sandbox.policy import HANDSHAKE_TIMEOUT_S, PROBE_TTL_S, SANDBOX_UID, Limits, SandboxUnavailable
from rl_engine.sandbox.process import SandboxProcess

# The first program of every sandbox, run by the platform's own Python outside it: joins the sandbox's cgroups
# (so none of its processes ever runs outside them) and a fresh, empty session keyring (so it never holds the
# platform's keys), then becomes the sandbox (bwrap; prlimit without one). Arguments: the keyctl system call's
# number ("-": unknown here), the cgroup.procs files, "--", the command. A refused keyctl means keyrings are out
# of reach here anyway (a container's own seccomp profile): the launcher goes on.
_LAUNCHER = """
import ctypes, errno, os, sys
keyctl, *rest = sys.argv[1:]
split = rest.index("--")
try:
    for procs in rest[:split]:
        with open(procs, "w") as handle:
            handle.write("0")
except OSError as exc:
    sys.exit(f"sandbox launcher: cannot join the sandbox's cgroup {procs}: {exc.strerror}")
if keyctl != "-":
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(int(keyctl)), ctypes.c_long(1), None) < 0:
        code = ctypes.get_errno()
        if code not in (errno.EPERM, errno.ENOSYS, errno.EACCES):
            sys.exit(f"sandbox launcher: cannot join a fresh session keyring: {os.strerror(code)}")
os.execv(rest[split + 1], rest[split + 1:])
"""


def _launcher(cgroup: sandbox_cgroup.SandboxCgroup | None) -> list[str]:
    keyctl = sandbox_seccomp.keyctl_number()
    procs = cgroup.procs_files if cgroup is not None else []
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, "-" if keyctl is None else str(keyctl), *procs, "--"]


_plan_lock = threading.Lock()
_plans: dict[str, tuple[float, sandbox_cgroup.Plan]] = {}


def _cgroup_plan() -> sandbox_cgroup.Plan:
    """Where sandboxes' cgroups go (looked at again at most once a minute, and when the delegated folder changes)."""
    key = os.environ.get(sandbox_cgroup.CGROUP_ENV, "")
    with _plan_lock:
        found = _plans.get(key)
        if found is None or time.monotonic() - found[0] > PROBE_TTL_S:
            found = _plans[key] = (time.monotonic(), sandbox_cgroup.plan())
        return found[1]


def _new_cgroup(limits: Limits) -> sandbox_cgroup.SandboxCgroup | None:
    """The sandbox's cgroups, or None where this host has none to give (status() warns about it). Raises
    SandboxUnavailable when the host has them but this one cannot be made: the limits are not dropped quietly."""
    layout = _cgroup_plan()
    if not layout.hierarchies:
        return None
    try:
        return sandbox_cgroup.SandboxCgroup.create(layout, limits.quota)
    except OSError as exc:
        raise SandboxUnavailable(f"cannot make the sandbox's cgroup: {exc}") from None


def _popen(
    bwrap: str,
    command: Sequence[str],
    limits: Limits,
    env: Mapping[str, str],
    files: Mapping[str, Path],
    sockets: Mapping[str, Path],
    pass_fds: tuple[int, ...],
    cwd: str = "/tmp",
    binds: Mapping[str, tuple[Path, bool]] | None = None,
) -> SandboxProcess:
    as_root = os.geteuid() == 0
    opened: list[int] = []
    cgroup = _new_cgroup(limits)
    try:
        args = [
            bwrap,
            *_namespace_args(as_root),
            *_seccomp_args(opened),
            *_filesystem_args(limits, files, sockets, opened, cwd, binds or {}),
        ]
        inner = ["/usr/bin/prlimit", *limits.prlimit_args(with_processes=True), "--", *command]
        if not as_root:
            proc = SandboxProcess(
                [*_launcher(cgroup), *args, "--", *inner],
                env=dict(env),
                pass_fds=(*pass_fds, *opened),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            return proc.adopt(cgroup, sandboxed=True)
        return _popen_as_root(_launcher(cgroup), args, inner, env, (*pass_fds, *opened), cgroup)
    except BaseException:
        if cgroup is not None:
            cgroup.remove()
        raise
    finally:
        for fd in opened:
            os.close(fd)


def _popen_as_root(
    launcher: list[str],
    args: list[str],
    inner: list[str],
    env: Mapping[str, str],
    pass_fds: tuple[int, ...],
    cgroup: sandbox_cgroup.SandboxCgroup | None,
) -> SandboxProcess:
    info_read, info_write = os.pipe()
    block_read, block_write = os.pipe()
    drop = [
        "/usr/bin/setpriv",
        f"--reuid={SANDBOX_UID}",
        f"--regid={SANDBOX_UID}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
    ]
    try:
        proc = SandboxProcess(
            [
                *launcher,
                *args[:1],
                "--info-fd",
                str(info_write),
                "--userns-block-fd",
                str(block_read),
                *args[1:],
                "--",
                *drop,
                *inner,
            ],
            env=dict(env),
            pass_fds=(*pass_fds, info_write, block_read),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except BaseException:
        for fd in (info_read, info_write, block_read, block_write):
            os.close(fd)
        raise
    os.close(info_write)
    os.close(block_read)
    proc.adopt(cgroup, sandboxed=True)
    try:
        child = _read_child_pid(info_read, proc)
        mapping = f"0 0 1\n{SANDBOX_UID} {SANDBOX_UID} 1\n"
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{child}/{name}", "w") as handle:
                handle.write(mapping)
        os.write(block_write, b"1")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        os.close(info_read)
        os.close(block_write)
    return proc


def _read_child_pid(fd: int, proc: subprocess.Popen) -> int:
    """The sandbox's first process, from bwrap's --info-fd JSON."""
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
    data = b""
    decoder = json.JSONDecoder()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SandboxUnavailable("bubblewrap did not report its sandbox in time")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            output = proc.stdout.read().decode(errors="replace").strip().splitlines() if proc.stdout else []
            code = proc.wait()
            raise SandboxUnavailable(output[-1] if output else f"bubblewrap exited with code {code}")
        data += chunk
        try:
            info, _ = decoder.raw_decode(data.decode())
        except ValueError:
            continue
        return int(info["child-pid"])
