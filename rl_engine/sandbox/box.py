"""The `Sandbox` a caller builds: one command to start, the files, folders and sockets it sees, then `popen`
(sandboxed, or a plain child process where the admin allowed unsandboxed code)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rl_engine.sandbox.availability import require
from rl_engine.sandbox.bwrap import _bwrap
from rl_engine.sandbox.launch import _launcher, _new_cgroup, _popen
from rl_engine.sandbox.policy import _INSTALL_HINT, CODE_DIR, RUN_DIR, Limits, SandboxUnavailable, sandbox_env
from rl_engine.sandbox.process import SandboxProcess


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
