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

- the kernel's, on the sandbox as a whole (`cgroup.py`): a cgroup of its own with a memory cap that counts
  tmpfs, /dev/shm and memfd pages (`Limits.memory_mb`), a process count (`pids.max`) and a CPU quota
  (`Limits.cpus`), on cgroup v2 or v1; where no cgroup can be made the sandbox runs without them and
  `status()` warns (shown on `/api/health/`);
- per process (`prlimit` before the command): processes and threads (RLIMIT_NPROC, counted per sandbox
  since each has its own user namespace), address space, CPU seconds, open files, file size, no core dumps;
- a seccomp filter (`seccomp.py`, given to `bwrap --seccomp`): no new user namespaces, no mounts, no
  keyrings, no ptrace, bpf or perf_event_open;
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

One module per concept, each importing only the ones listed above it:

- `cgroup.py`: a cgroup of its own for every sandbox (memory, pids, cpu, on cgroup v2 or v1);
- `seccomp.py`: the seccomp filter every sandbox runs under;
- `policy.py`: `Limits`, the cleared environment (`sandbox_env`), the settings, `SandboxUnavailable`;
- `process.py`: a started sandbox (`SandboxProcess`) and every process it holds; `died_by_signal`;
- `bwrap.py`: bubblewrap's command line: namespaces, the seccomp filter, the filesystem (`python_runtime`);
- `launch.py`: the launcher (`_LAUNCHER`), the sandbox's cgroups, starting bubblewrap (as root too);
- `availability.py`: `status`, `kernel_limits`, `require` (the probe), and the gate of a run (`require_sandbox`);
- `box.py`: the `Sandbox` a caller builds and starts (`popen`);
- `output.py`: `OutputRelay`, what sandboxed code prints, relayed to our stderr;
- `reporting.py`: `run_reporting`, a command that reports on a pipe.
"""

from rl_engine.sandbox.availability import (
    SandboxStatus,
    kernel_limits,
    require,
    require_sandbox,
    runs_user_code,
    status,
)
from rl_engine.sandbox.box import Sandbox
from rl_engine.sandbox.bwrap import python_runtime
from rl_engine.sandbox.output import OutputRelay
from rl_engine.sandbox.policy import (
    ALLOW_UNSANDBOXED_ENV,
    BWRAP_ENV,
    CODE_DIR,
    HANDSHAKE_TIMEOUT_S,
    PROBE_TTL_S,
    RUN_DIR,
    SANDBOX_UID,
    Limits,
    SandboxUnavailable,
    sandbox_env,
    unsandboxed_allowed,
)
from rl_engine.sandbox.process import SandboxProcess, died_by_signal
from rl_engine.sandbox.reporting import Reported, ReportTooLarge, read_pipe, run_reporting

__all__ = [
    "ALLOW_UNSANDBOXED_ENV",
    "BWRAP_ENV",
    "CODE_DIR",
    "HANDSHAKE_TIMEOUT_S",
    "PROBE_TTL_S",
    "RUN_DIR",
    "SANDBOX_UID",
    "Limits",
    "OutputRelay",
    "ReportTooLarge",
    "Reported",
    "Sandbox",
    "SandboxProcess",
    "SandboxStatus",
    "SandboxUnavailable",
    "died_by_signal",
    "kernel_limits",
    "python_runtime",
    "read_pipe",
    "require",
    "require_sandbox",
    "run_reporting",
    "runs_user_code",
    "sandbox_env",
    "status",
    "unsandboxed_allowed",
]
