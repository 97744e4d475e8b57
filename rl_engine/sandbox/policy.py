"""What a sandbox allows and the settings that govern it: its limits (`Limits`), its cleared environment
(`sandbox_env`), the admin's override, the sandbox's user and folders, and `SandboxUnavailable`, the refusal
where none can be made."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rl_engine.sandbox import cgroup as sandbox_cgroup

ALLOW_UNSANDBOXED_ENV = "POSTTRAIN_ALLOW_UNSANDBOXED_CODE"
BWRAP_ENV = "POSTTRAIN_BWRAP"  # the bwrap binary (default: `bwrap` on PATH)
SANDBOX_UID = 65534  # nobody
CODE_DIR = "/sandbox"  # where the caller's files appear
RUN_DIR = "/run/posttrain"  # the engine's own files and sockets inside the sandbox
HANDSHAKE_TIMEOUT_S = 10.0
PROBE_TTL_S = 60.0  # a machine that gets bubblewrap (or loses user namespaces) is seen within a minute
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


def unsandboxed_allowed() -> bool:
    return os.environ.get(ALLOW_UNSANDBOXED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


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
