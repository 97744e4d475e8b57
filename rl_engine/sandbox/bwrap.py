"""bubblewrap's command line: the binary, the namespaces, the seccomp filter and the filesystem a sandbox sees
(the Python runtime in it included)."""

from __future__ import annotations

import os
import shutil
import site
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from rl_engine.sandbox import seccomp as sandbox_seccomp
from rl_engine.sandbox.policy import BWRAP_ENV, SANDBOX_UID, Limits, SandboxUnavailable


def _bwrap() -> str | None:
    return shutil.which(os.environ.get(BWRAP_ENV) or "bwrap")


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
    _mount_host_system(plan)
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


def _mount_host_system(plan: _MountPlan) -> None:
    """The host's /usr and top-level system folders (a merged-/usr symlink stays a symlink), read-only, with
    the loader cache and the time zone."""
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
