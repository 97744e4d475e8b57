"""Untrusted code runs here: reward functions, environments and agent commands, each in a bubblewrap sandbox.

Bubblewrap (Debian's `bubblewrap`, the sandbox Flatpak uses; `make install` installs it) starts the command
in new user, PID, network, IPC and UTS namespaces with a root filesystem of our choosing:

- a private `/tmp` and `/dev/shm` (tmpfs, `Limits.tmp_mb` each), a private `/proc` and a minimal `/dev`,
  mounted first, so that what is bound below comes on top of them (a runtime under /tmp stays visible);
- read-only: `/usr` (with the `/bin`, `/lib*` links of a merged-/usr system), `/etc/ld.so.cache` and the
  time zone, the Python runtime (`sys.base_prefix`, `sys.prefix` and every site-packages folder, symlinks
  resolved, so a venv outside the repository works and `import torch` does too), and the files the caller
  hands in (the user's file, copied in through a file descriptor), or binds in whole (`Sandbox.add_bind`: a
  model file too large to copy);
- writable, besides /tmp: only a folder the caller binds writable (`add_bind`: where a conversion writes
  the model it makes) and the engine's sockets;
- nothing else: no POSTTRAIN_HOME, storage, run folders, home directory or repository, no other
  process (`/proc` shows the sandbox's own), no network but its own loopback.

The environment is cleared (only PATH, HOME=/tmp, locale and thread-count settings, plus what the caller
adds). Limits:

- the kernel's, on the sandbox as a whole (`rl_engine/sandbox_cgroup.py`): a cgroup of its own with a memory
  cap that counts tmpfs, /dev/shm and memfd pages (`Limits.memory_mb`), a process count (`pids.max`) and a CPU
  quota (`Limits.cpus`), on cgroup v2 or v1; where no cgroup can be made the sandbox runs without them and
  `status()` warns (shown on `/api/health/`);
- per process (`prlimit` before the command): processes and threads (RLIMIT_NPROC, counted per sandbox
  since each has its own user namespace), address space, CPU seconds, open files, file size, no core dumps;
- a seccomp filter (`rl_engine/sandbox_seccomp.py`, given to `bwrap --seccomp`): no new user namespaces, no
  mounts, no keyrings, no ptrace, bpf or perf_event_open;
- a fresh, empty session keyring: the sandbox never holds the platform's keys.

A small launcher (`_LAUNCHER`, the platform's own Python) starts each sandbox: it joins the sandbox's cgroups
and a fresh session keyring, then becomes bubblewrap, so nothing of the sandbox runs outside either. The
caller gets a `SandboxProcess`: `kill_strays()` ends every process a call left behind (all but the command
itself), `kill()` and `wait()` end all of them and remove the cgroups. The sandbox is killed with its parent
(`--die-with-parent`: note that Linux sends this when the *thread* that started the sandbox exits).

Running as root. Inside a user namespace that maps the sandbox user to root outside, the kernel would not
enforce RLIMIT_NPROC (root is exempt). So when we are root, bwrap waits (`--userns-block-fd`) while we map
the namespace's uid 0 to root (bwrap needs it to build the filesystem) and uid 65534 to `nobody`, and the
command starts through `setpriv` as `nobody` with no capabilities left; then every limit holds. bwrap refuses
`--disable-userns` on this path, so the seccomp filter is what keeps nested user namespaces out.

When no sandbox can be made (bwrap missing, user namespaces disabled), user code is refused with
`SandboxUnavailable` saying what to install, unless POSTTRAIN_ALLOW_UNSANDBOXED_CODE=1 (for a single-user
machine): then the command runs as a plain child process with the same cleared environment, the limits that
do not need a namespace and the cgroup.

Standard library only (and `pyseccomp` for the filter); no Django.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import site
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from rl_engine import sandbox_cgroup, sandbox_seccomp

if TYPE_CHECKING:
    from posttrain_sdk.event_log import EventLog
    from rl_engine.config import RunConfig

ALLOW_UNSANDBOXED_ENV = "POSTTRAIN_ALLOW_UNSANDBOXED_CODE"
BWRAP_ENV = "POSTTRAIN_BWRAP"  # the bwrap binary (default: `bwrap` on PATH)
SANDBOX_UID = 65534  # nobody
CODE_DIR = "/sandbox"  # where the caller's files appear
RUN_DIR = "/run/posttrain"  # the engine's own files and sockets inside the sandbox
HANDSHAKE_TIMEOUT_S = 10.0
# Settings that change how fast code runs, never what it may reach.
_PASSED_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE")
_INSTALL_HINT = (
    "install Debian's bubblewrap (`apt-get install bubblewrap`; `make install` does it), or, on a single-user "
    f"machine only, let an admin set {ALLOW_UNSANDBOXED_ENV}=1 to run user code without a sandbox"
)


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made here and unsandboxed code is not allowed; the message says what to do."""


@dataclass(frozen=True)
class Limits:
    """A sandbox's limits (`processes` counts every process and thread of the sandbox)."""

    # The sandbox's memory as a whole (its cgroup: processes, tmpfs, /dev/shm and memfd pages together; past it
    # the kernel's OOM killer ends a process), and each process's address space (RLIMIT_AS: a runaway
    # allocation raises MemoryError first).
    memory_mb: float = 1024.0
    processes: int = 64
    cpu_s: int = 600  # CPU seconds of one process (RLIMIT_CPU); a long-lived child asks to be replaced at half
    cpus: float = 1.0  # the sandbox's CPU quota, in cores (its cgroup)
    open_files: int = 1024
    file_mb: int = 64  # the largest file it may write (RLIMIT_FSIZE)
    tmp_mb: int = 64  # size of the private /tmp and of /dev/shm

    @property
    def quota(self) -> sandbox_cgroup.Quota:
        # bubblewrap's own two processes (outside the sandbox, and its init inside) sit in the cgroup too
        return sandbox_cgroup.Quota(int(self.memory_mb * 1024 * 1024), self.processes + 2, self.cpus)

    def prlimit_args(self, with_processes: bool) -> list[str]:
        memory = int(self.memory_mb * 1024 * 1024)
        args = [
            f"--as={memory}",
            f"--cpu={self.cpu_s}",
            f"--nofile={self.open_files}",
            f"--fsize={self.file_mb * 1024 * 1024}",
            "--core=0",
        ]
        if with_processes:  # without a user namespace of its own, it would count all of this user's processes
            args.insert(0, f"--nproc={self.processes}")
        return args


@dataclass(frozen=True)
class SandboxStatus:
    available: bool
    detail: str  # the bwrap version, or why no sandbox can be made
    unsandboxed_allowed: bool
    limits: str = ""  # the kernel's limits a sandbox gets here (cgroups, seccomp, keyring)
    warnings: tuple[str, ...] = ()  # the limits that cannot be enforced here, each with why


def unsandboxed_allowed() -> bool:
    return os.environ.get(ALLOW_UNSANDBOXED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _bwrap() -> str | None:
    return shutil.which(os.environ.get(BWRAP_ENV) or "bwrap")


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


PROBE_TTL_S = 60.0  # a machine that gets bubblewrap (or loses user namespaces) is seen within a minute
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


# --- starting a command ----------------------------------------------------------------------------


@dataclass
class Sandbox:
    """One command to start, sandboxed when `sandboxed` (see `require`): collect its files, then `popen`."""

    limits: Limits
    sandboxed: bool
    files: dict[str, Path]  # path inside -> host file, copied in read-only
    sockets: dict[str, Path]  # path inside -> host Unix socket
    cwd: str = "/tmp"  # the command's working folder inside (read-only unless /tmp)
    binds: dict[str, tuple[Path, bool]] = field(default_factory=dict)  # path inside -> (host path, writable)

    @classmethod
    def create(cls, limits: Limits) -> Sandbox:
        return cls(limits, require(), {}, {})

    def add_file(self, host_path: str | os.PathLike, inside_dir: str = CODE_DIR, same_path: bool = False) -> str:
        """Makes a host file visible to the command (a copy, read-only; at its own path when `same_path`,
        else in `inside_dir`); returns the path the command must use."""
        host = Path(host_path).resolve()
        if not self.sandboxed:
            return str(host)
        inside = str(host) if same_path else f"{inside_dir}/{host.name}"
        self.files[inside] = host
        return inside

    def add_bind(self, host_path: str | os.PathLike, inside: str, writable: bool = False) -> str:
        """Makes a host file or folder visible to the command at `inside` as it is, not copied (a file too large to
        copy in, a folder the command writes its output to), read-only unless `writable`; returns the path the
        command must use. The command's user must be allowed to read it (and to write a writable folder): run as
        root, the command is `nobody` (SANDBOX_UID)."""
        host = Path(host_path).resolve()
        if not self.sandboxed:
            return str(host)
        self.binds[inside] = (host, writable)
        return inside

    def add_socket(self, host_path: str | os.PathLike, name: str) -> str:
        host = Path(host_path)
        if not self.sandboxed:
            return str(host)
        inside = f"{RUN_DIR}/{name}"
        self.sockets[inside] = host
        return inside

    def popen(
        self,
        command: Sequence[str],
        env: Mapping[str, str] | None = None,
        pass_fds: Iterable[int] = (),
    ) -> SandboxProcess:
        """Starts the command; its stdout and stderr come back merged on `proc.stdout` (a pipe of bytes):
        relay them with `OutputRelay`."""
        environment = sandbox_env(env or {})
        if not self.sandboxed:
            cgroup = _new_cgroup(self.limits)
            prlimit = shutil.which("prlimit", path="/usr/bin:/bin") or "/usr/bin/prlimit"
            try:
                proc = SandboxProcess(
                    [*_launcher(cgroup), prlimit, *self.limits.prlimit_args(with_processes=False), "--", *command],
                    env=environment,
                    pass_fds=tuple(pass_fds),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except BaseException:
                if cgroup is not None:
                    cgroup.remove()
                raise
            return proc.adopt(cgroup, sandboxed=False)
        bwrap = _bwrap()
        if bwrap is None:
            raise SandboxUnavailable(f"bubblewrap is not installed; {_INSTALL_HINT}")
        return _popen(
            bwrap, command, self.limits, environment, self.files, self.sockets, tuple(pass_fds), self.cwd, self.binds
        )


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


class SandboxProcess(subprocess.Popen):
    """A started sandbox: the Popen of its first process (the launcher, which becomes bubblewrap), which knows
    every process of the sandbox. `kill()` and `wait()` end all of them and remove the cgroups;
    `kill_strays()` ends all but the command itself (what a call forked and left running)."""

    stdout: IO[bytes]  # never None: every sandbox starts with stdout=PIPE (stderr merged into it)
    cgroup: sandbox_cgroup.SandboxCgroup | None = None
    sandboxed: bool = True

    def adopt(self, cgroup: sandbox_cgroup.SandboxCgroup | None, sandboxed: bool) -> SandboxProcess:
        self.cgroup, self.sandboxed = cgroup, sandboxed
        self._finalizer = weakref.finalize(self, _release, cgroup)
        return self

    def members(self) -> set[int]:
        """The pids of every living process of the sandbox (this one included while it runs)."""
        if self.cgroup is not None and self.cgroup.folders:
            found = self.cgroup.pids()
        elif self.sandboxed:  # every process of its PID namespace descends from bubblewrap (orphans included)
            found = _descendants(self.pid)
        else:
            found = _session(self.pid)  # without a namespace or a cgroup: what kept the session started here
        return {pid for pid in found if not sandbox_cgroup.dead(pid)}

    def _kept(self, pid: int) -> bool:
        """The command (and bubblewrap's two processes: this one, and the namespace's init, pid 1 inside;
        the command is pid 2 inside, whatever it exec'd)."""
        if pid == self.pid:
            return True
        if not self.sandboxed:
            return False
        inside = _namespace_pids(pid)
        return len(inside) == 2 and inside[1] in (1, 2)

    def kill_strays(self, timeout_s: float = 1.0) -> bool:
        """SIGKILLs every process of the sandbox but the command; False if some still lived after `timeout_s`
        (a command that keeps forking): then kill the whole sandbox."""
        if self.poll() is not None:
            return True
        return sandbox_cgroup.kill_until_gone(self.members, lambda pid: not self._kept(pid), timeout_s)

    def kill(self) -> None:
        super().kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            super().wait(timeout=5)  # reaped first: its cgroup cannot be removed while it is a zombie
        self.release()

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self.release()
        return code

    def release(self) -> None:
        """Ends every process of the sandbox and removes its cgroups."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        if self.cgroup is None and not self.sandboxed:
            # No namespace, no cgroup: what the command left in its session (bubblewrap's end ends its namespace).
            sandbox_cgroup.kill_until_gone(lambda: _session(self.pid), lambda pid: pid != self.pid, 2.0)


def _release(cgroup: sandbox_cgroup.SandboxCgroup | None) -> None:
    if cgroup is not None:
        cgroup.remove()


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.add(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with contextlib.suppress(OSError):
                    todo += [int(child) for child in Path(f"/proc/{current}/task/{task}/children").read_text().split()]
    return found


def _session(sid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat[stat.rindex(")") + 2 :].split()[3]) == sid:
                    found.add(int(entry))
    return found


def _namespace_pids(pid: int) -> list[int]:
    """The pid as each PID namespace from ours down sees it (NSpid)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(n) for n in line.split()[1:]]
    return []


def sandbox_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The cleared environment of sandboxed code: no tokens, no server addresses."""
    env = {
        "PATH": os.pathsep.join(
            dict.fromkeys([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
        ),
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update({name: os.environ[name] for name in _PASSED_ENV if name in os.environ})
    env.update(extra)
    return env


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


def _seccomp_args(opened: list[int]) -> list[str]:
    program = sandbox_seccomp.seccomp_filter().program
    if program is None:
        return []  # status() warns
    return ["--seccomp", str(_memfd(program, opened))]


def _namespace_args(as_root: bool) -> list[str]:
    args = ["--unshare-all", "--unshare-user", "--hostname", "sandbox", "--die-with-parent", "--new-session"]
    if as_root:
        # uid 0 inside stays root (bwrap builds the filesystem with it); the command becomes nobody (setpriv).
        return [*args, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    return [*args, "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--disable-userns"]


def _filesystem_args(
    limits: Limits,
    files: Mapping[str, Path],
    sockets: Mapping[str, Path],
    opened: list[int],
    cwd: str,
    binds: Mapping[str, tuple[Path, bool]],
) -> list[str]:
    plan = _MountPlan()
    # The sandbox's own /proc, /dev, /tmp and /dev/shm first: a bind below /tmp (the runtime of a project
    # installed there) must come on top of the private /tmp, not under it.
    plan.args += ["--proc", "/proc", "--dev", "/dev"]
    tmp_bytes = str(limits.tmp_mb * 1024 * 1024)
    for folder in ("/tmp", "/dev/shm"):
        plan.args += ["--perms", "1777", "--size", tmp_bytes, "--tmpfs", folder]
    plan.made("/proc", "/dev", "/tmp", "/dev/shm")
    plan.bind("/usr")
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / top
        if host.is_symlink():
            plan.symlink(os.readlink(host), str(host))
        elif host.is_dir():
            plan.bind(str(host))
    for path in ("/etc/ld.so.cache", "/etc/localtime"):
        if os.path.exists(path):
            plan.bind(path)
    plan.data("/etc/hosts", _memfd(b"127.0.0.1 localhost\n::1 localhost\n", opened))
    plan.data("/etc/passwd", _memfd(f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}::/tmp:/bin/sh\n".encode(), opened))
    plan.data("/etc/group", _memfd(f"sandbox:x:{SANDBOX_UID}:\n".encode(), opened))
    for real, link in python_runtime():
        plan.bind(real)
        if link:
            plan.symlink(real, link)
    for inside, host in files.items():
        fd = os.open(host, os.O_RDONLY | os.O_CLOEXEC)
        opened.append(fd)
        plan.data(inside, fd)
    for inside, host in sockets.items():
        plan.bind(str(host), inside, writable=True)
    for inside, (host, writable) in binds.items():
        plan.bind(str(host), inside, writable=writable)
    if cwd != "/tmp":
        plan.folder(cwd)
    # The root (and every folder made above) read-only: only /tmp and /dev/shm, which have a size, take writes.
    return [*plan.args, "--remount-ro", "/", "--chdir", cwd]


class _MountPlan:
    """bwrap's filesystem arguments. Folders above each mount are made world-readable first: bwrap would
    make them 0700 as root, closed to the sandbox's user."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self._made = {"/"}

    def made(self, *folders: str) -> None:
        """Folders mounted already (their parents and themselves are not made again)."""
        self._made.update(folders)

    def _parents(self, path: str) -> None:
        for parent in reversed(Path(path).parents):
            if str(parent) not in self._made:
                self.args += ["--perms", "0755", "--dir", str(parent)]
                self._made.add(str(parent))

    def folder(self, dest: str) -> None:
        if dest not in self._made:
            self._parents(dest)
            self.args += ["--perms", "0755", "--dir", dest]
            self._made.add(dest)

    def bind(self, source: str, dest: str | None = None, writable: bool = False) -> None:
        dest = dest or source
        self._parents(dest)
        self.args += ["--bind" if writable else "--ro-bind", source, dest]
        self._made.add(dest)

    def symlink(self, target: str, dest: str) -> None:
        self._parents(dest)
        self.args += ["--symlink", target, dest]
        self._made.add(dest)

    def data(self, dest: str, fd: int) -> None:
        self._parents(dest)
        self.args += ["--perms", "0444", "--ro-bind-data", str(fd), dest]


def _memfd(content: bytes, opened: list[int]) -> int:
    fd = os.memfd_create("sandbox-file", os.MFD_CLOEXEC)
    opened.append(fd)
    os.write(fd, content)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def python_runtime() -> list[tuple[str, str | None]]:
    """(real folder, path that links to it or None) for the interpreter, its standard library and every
    site-packages folder: the only Python the sandbox sees. /usr is bound anyway; folders inside another
    are left out."""
    candidates = [
        sys.base_prefix,
        sys.base_exec_prefix,
        sys.prefix,
        sys.exec_prefix,
        str(Path(sys.executable).parent.parent),
        str(Path(os.path.realpath(sys.executable)).parent.parent),
        *site.getsitepackages(),
    ]
    links: dict[str, str | None] = {}
    for path in candidates:
        absolute = os.path.abspath(path)
        real = os.path.realpath(absolute)
        if not os.path.isdir(real) or real == "/" or _inside(real, ["/usr"]):
            continue
        _refuse_exposing(real)
        links.setdefault(real, None)
        if absolute != real:
            links[real] = absolute
    folders = [real for real in links if not _inside(real, [other for other in links if other != real])]
    return [(real, None if _inside(links[real] or "/", folders) else links[real]) for real in sorted(folders)]


def _inside(path: str, folders: Iterable[str]) -> bool:
    return any(path == folder or path.startswith(folder.rstrip("/") + "/") for folder in folders)


def _refuse_exposing(folder: str) -> None:
    """A runtime folder that holds the home directory or the platform's state would show them."""
    protected = [os.path.expanduser("~")]
    protected += [os.environ[name] for name in ("POSTTRAIN_HOME", "POSTTRAIN_STORAGE") if os.environ.get(name)]
    for path in protected:
        if _inside(os.path.realpath(path), [folder]):
            raise SandboxUnavailable(
                f"the Python runtime folder {folder} contains {path}; a sandbox would show it: install Python "
                "(or the venv) elsewhere"
            )


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


def died_by_signal(returncode: int | None, sandboxed: bool) -> int | None:
    """The signal that ended a sandboxed command (bwrap exits with 128 + its number), or None."""
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if sandboxed and returncode > 128:
        return returncode - 128
    return None


class OutputRelay:
    """Copies what sandboxed code prints to our stderr: at most `burst` bytes at once, then `rate` bytes/s;
    the rest is dropped and counted, so endless output cannot fill the job log or stall the code."""

    TAIL_BYTES = 2048

    def __init__(self, source, sink_fd: int = 2, burst: int = 1 << 20, rate: float = 64 << 10, label: str = "sandbox"):
        self._source = source
        self._sink = sink_fd
        self._burst, self._rate, self._label = burst, rate, label
        self.dropped = 0
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self._thread = threading.Thread(target=self._run, name=f"{label}-output", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tokens, last, dropped = float(self._burst), time.monotonic(), 0
        fd = self._source.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            self._keep(chunk)
            now = time.monotonic()
            tokens, last = min(float(self._burst), tokens + (now - last) * self._rate), now
            if dropped and tokens >= self._burst / 2:
                self._write(f"[{self._label}: {dropped} bytes of output dropped]\n".encode())
                dropped = 0
            if dropped or len(chunk) > tokens:
                if not dropped:
                    # A flood spends what is left of the burst, so it ends only once half the burst has
                    # refilled: one note per flood, not one per chunk that happens to fit.
                    tokens = 0.0
                dropped += len(chunk)
                self.dropped += len(chunk)
                continue
            self._write(chunk)
            tokens -= len(chunk)
        if dropped:
            self._write(f"[{self._label}: {dropped} bytes of output dropped]\n".encode())
        self._source.close()

    def _keep(self, chunk: bytes) -> None:
        self._tail.append(chunk[-self.TAIL_BYTES :])
        self._tail_size += len(self._tail[-1])
        while self._tail_size - len(self._tail[0]) >= self.TAIL_BYTES:
            self._tail_size -= len(self._tail.popleft())

    def tail(self, lines: int = 3, chars: int = 500) -> str:
        """The last lines the command printed (at most `chars` characters), for a reason it failed."""
        text = b"".join(self._tail).decode(errors="replace")
        kept = [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]
        return " | ".join(kept)[-chars:]

    def _write(self, data: bytes) -> None:
        try:
            while data:
                data = data[os.write(self._sink, data) :]
        except OSError:
            pass

    def join(self, timeout_s: float | None) -> None:  # None: until the code's output ends
        self._thread.join(timeout_s)


# --- a command that reports on a pipe ---------------------------------------------------------


class ReportTooLarge(ValueError):
    """A command wrote more than the caller reads of its report."""


@dataclass(frozen=True)
class Reported:
    """What a reporting command left: its report, its exit code, whether it lingered after closing the pipe
    (then killed), and the last lines it printed (for a reason it failed)."""

    data: bytes
    returncode: int | None
    lingered: bool
    tail: str


def run_reporting(
    box: Sandbox,
    command: Callable[[int], Sequence[str]],
    *,
    timeout_s: float,
    max_bytes: int,
    label: str,
    env: Mapping[str, str] | None = None,
    exit_grace_s: float = 15.0,
) -> Reported:
    """Runs `command(fd)` in the sandbox, `fd` the write end of a pipe for its report, and reads the report
    until the command closes its end: TimeoutError once `timeout_s` pass, ReportTooLarge past `max_bytes`;
    either way the sandbox is killed. A command still running `exit_grace_s` after closing the pipe is killed
    too (its report is whole). What it prints is relayed to our stderr (OutputRelay)."""
    read_fd, write_fd = os.pipe()
    try:
        proc = box.popen(command(write_fd), env=env, pass_fds=(write_fd,))
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    os.close(write_fd)
    relay = OutputRelay(proc.stdout, label=label)
    lingered = False
    try:
        data = read_pipe(read_fd, time.monotonic() + timeout_s, max_bytes)
        try:
            proc.wait(timeout=exit_grace_s)
        except subprocess.TimeoutExpired:
            lingered = True
    finally:
        os.close(read_fd)
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)
    relay.join(1.0)
    return Reported(data, proc.returncode, lingered, relay.tail().strip())


def read_pipe(fd: int, deadline: float, max_bytes: int) -> bytes:
    """Everything written to the pipe `fd` until every writer has closed it: TimeoutError once `deadline`
    (time.monotonic()) passes, ReportTooLarge past `max_bytes`."""
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    size = 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the command did not finish in time")
        if not poller.poll(max(1, int(left * 1000))):
            continue
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            continue
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise ReportTooLarge(f"the command wrote over {max_bytes} bytes")
        chunks.append(chunk)


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
