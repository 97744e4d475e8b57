"""A started sandbox (`SandboxProcess`): every process it holds, found through its cgroup, its PID namespace or
its session, and how they all end; `died_by_signal` reads how its command ended."""

from __future__ import annotations

import contextlib
import os
import subprocess
import weakref
from pathlib import Path
from typing import IO

from rl_engine.sandbox import cgroup as sandbox_cgroup


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


def died_by_signal(returncode: int | None, sandboxed: bool) -> int | None:
    """The signal that ended a sandboxed command (bwrap exits with 128 + its number), or None."""
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if sandboxed and returncode > 128:
        return returncode - 128
    return None
