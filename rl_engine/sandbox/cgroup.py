"""A cgroup of its own for every sandbox: limits the kernel enforces on all of the sandbox's processes together.

- memory: everything the sandbox holds in memory, its processes and its files in memory (tmpfs, /dev/shm,
  memfd and other shmem pages, which RLIMIT_AS does not count) alike; past it the kernel's OOM killer ends a
  process of the sandbox (`memory.max` and `memory.swap.max` = 0 on cgroup v2, `memory.limit_in_bytes` and
  `memory.memsw.limit_in_bytes` on v1);
- pids: processes and threads together (`pids.max`);
- cpu: a quota of CPU time per period, in cores (`cpu.max` on v2, `cpu.cfs_quota_us` on v1).

Each controller is taken from the hierarchy that has it: cgroup v2 where the unified hierarchy offers it,
else its v1 hierarchy (hosts in "hybrid" mode have v1 controllers next to an empty v2 hierarchy). A sandbox's
groups are made below this process's own group in each hierarchy (so whatever limits the platform itself
runs under still hold), in a folder `posttrain-sandboxes/`, or below `POSTTRAIN_SANDBOX_CGROUP` on v2: a
folder of a cgroup v2 hierarchy delegated to the platform's user (the way not to need root: systemd's
`Delegate=yes`). Where none can be made (not root and nothing delegated, or no controllers), sandboxes run
without them and `status()` says what is missing (`/api/health/` shows it as a warning).

The sandbox's launcher joins the groups itself (it writes to `cgroup.procs` before it starts bubblewrap), so
no process of the sandbox ever runs outside them. The groups also list the sandbox's processes: the caller
kills the ones a call left behind, and all of them at the end.

Standard library only; no Django.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ENV = "POSTTRAIN_SANDBOX_CGROUP"
CONTROLLERS = ("memory", "pids", "cpu")
FOLDER = "posttrain-sandboxes"
CPU_PERIOD_US = 100_000
REMOVE_WAIT_S = 2.0


@dataclass(frozen=True)
class Hierarchy:
    version: int  # 1 or 2
    base: Path  # the folder sandbox groups are made below (this process's own group, or the delegated one)
    controllers: frozenset[str]  # the ones of CONTROLLERS this hierarchy can limit a sandbox with


@dataclass(frozen=True)
class Plan:
    """Where each controller comes from; `missing` the ones no hierarchy here offers (or lets us use)."""

    hierarchies: tuple[Hierarchy, ...]
    missing: tuple[str, ...]
    problems: tuple[str, ...]  # why a hierarchy that exists cannot be used

    @property
    def detail(self) -> str:
        used = []
        for version in (2, 1):
            controllers = {c for h in self.hierarchies if h.version == version for c in h.controllers}
            if controllers:
                used.append(f"cgroup v{version} ({', '.join(c for c in CONTROLLERS if c in controllers)})")
        text = " + ".join(used) if used else "no cgroup"
        if self.missing:
            text += f"; not limited: {', '.join(self.missing)}"
            if self.problems:
                text += f" ({'; '.join(self.problems)})"
        return text


@dataclass(frozen=True)
class Quota:
    memory_bytes: int
    pids: int
    cpus: float


def limit_files(version: int, quota: Quota) -> dict[str, list[tuple[str, str]]]:
    """The files a sandbox's group gets, by controller, in the order they must be written (on v1 the swap
    limit cannot be set below the memory limit, so the memory limit goes first)."""
    cpu_quota = str(max(1000, round(quota.cpus * CPU_PERIOD_US)))
    if version == 2:
        return {
            "memory": [("memory.max", str(quota.memory_bytes)), ("memory.swap.max", "0")],
            "pids": [("pids.max", str(quota.pids))],
            "cpu": [("cpu.max", f"{cpu_quota} {CPU_PERIOD_US}")],
        }
    return {
        "memory": [
            ("memory.limit_in_bytes", str(quota.memory_bytes)),
            ("memory.memsw.limit_in_bytes", str(quota.memory_bytes)),
        ],
        "pids": [("pids.max", str(quota.pids))],
        "cpu": [("cpu.cfs_period_us", str(CPU_PERIOD_US)), ("cpu.cfs_quota_us", cpu_quota)],
    }


# --- finding the hierarchies -------------------------------------------------------------------


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(fstype, root inside the hierarchy, mount point, super options) of every cgroup mount."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        fstype = fields[dash + 1]
        if fstype in ("cgroup", "cgroup2"):
            options = set(fields[dash + 3].split(",")) if len(fields) > dash + 3 else set()
            found.append((fstype, _unescape(fields[3]), _unescape(fields[4]), options))
    return found


def _unescape(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _own_groups() -> dict[frozenset[str], str]:
    """This process's group per hierarchy: the controllers of a v1 hierarchy (empty for v2) -> path."""
    groups = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        groups[frozenset(c for c in controllers.split(",") if c)] = path
    return groups


def _folder(mount: str, root: str, path: str) -> Path | None:
    """The group `path` (relative to the hierarchy's root) in a mount of the hierarchy's subtree `root`."""
    root = root.rstrip("/")
    if root and path != root and not path.startswith(root + "/"):
        return None  # our group lies outside what this mount shows
    return Path(mount + path[len(root) :]).resolve() if path[len(root) :] else Path(mount)


def plan() -> Plan:
    """Which hierarchy limits which controller for sandboxes made by this process."""
    mounts, own = _mounts(), _own_groups()
    hierarchies: list[Hierarchy] = []
    problems: list[str] = []
    v2 = next((m for m in mounts if m[0] == "cgroup2"), None)
    if v2 is not None and frozenset() in own:
        unified = _v2_hierarchy(v2, own[frozenset()], problems)
        if unified is not None:
            hierarchies.append(unified)
    for fstype, root, mount, options in mounts:
        if fstype != "cgroup":
            continue
        controllers = frozenset(c for c in options if c in CONTROLLERS)
        wanted = controllers - {c for h in hierarchies for c in h.controllers}
        key = next((k for k in own if k and k <= options), None)
        if not wanted or key is None:
            continue
        base = _folder(mount, root, own[key])
        if base is None:
            continue
        if not os.access(base, os.W_OK):
            problems.append(f"cgroup v1 {mount} is not writable here (not root)")
            continue
        hierarchies.append(Hierarchy(1, base, wanted))
    if not mounts:
        problems.append("no cgroup filesystem is mounted")
    covered = {c for h in hierarchies for c in h.controllers}
    return Plan(tuple(hierarchies), tuple(c for c in CONTROLLERS if c not in covered), tuple(problems))


def _v2_hierarchy(mount: tuple[str, str, str, set[str]], own_path: str, problems: list[str]) -> Hierarchy | None:
    """The cgroup v2 hierarchy sandboxes go under: the delegated folder (CGROUP_ENV) or this process's own
    group in the v2 `mount`; None where there is none or it is not writable."""
    delegated = os.environ.get(CGROUP_ENV, "").strip()
    base = Path(delegated) if delegated else _folder(mount[2], mount[1], own_path)
    if delegated:
        with contextlib.suppress(OSError):
            Path(delegated).mkdir(exist_ok=True)  # e.g. /sys/fs/cgroup/posttrain, made by a root platform
    if base is None:
        return None
    offered = _v2_offered(base, problems)
    if os.access(base, os.W_OK):  # without controllers it still holds and lists the sandbox's processes
        return Hierarchy(2, base, frozenset(offered))
    return None


def _v2_offered(base: Path, problems: list[str]) -> set[str]:
    """The controllers of CONTROLLERS that groups below `base` can have: offered to `base` and enabled for
    its children (enabled here if need be, which the kernel refuses while `base` itself holds processes)."""
    try:
        available = set((base / "cgroup.controllers").read_text().split())
        enabled = set((base / "cgroup.subtree_control").read_text().split())
    except OSError as exc:
        problems.append(f"cgroup v2 {base} cannot be read ({exc.strerror})")
        return set()
    wanted = available & set(CONTROLLERS)
    if not os.access(base, os.W_OK):
        if wanted:
            problems.append(f"cgroup v2 {base} is not writable here: delegate it, or set {CGROUP_ENV}")
        return set()
    for controller in wanted - enabled:
        try:
            (base / "cgroup.subtree_control").write_text(f"+{controller}")
        except OSError as exc:
            problems.append(
                f"cgroup v2 {base} cannot hand {controller} to sandbox groups ({exc.strerror}: a group that "
                f"holds processes cannot; set {CGROUP_ENV} to an empty delegated folder)"
            )
            wanted.discard(controller)
    return wanted


# --- one sandbox's groups ----------------------------------------------------------------------

_counter = itertools.count(1)
_swept: set[Path] = set()
_sweep_lock = threading.Lock()


@dataclass
class SandboxCgroup:
    """The groups of one sandbox, one per hierarchy used. `procs_files` are what its launcher writes to."""

    folders: list[tuple[Hierarchy, Path]] = field(default_factory=list)
    oom_killed: int = 0  # the OOM kill count when the groups were removed

    @classmethod
    def create(cls, layout: Plan, quota: Quota) -> SandboxCgroup:
        """Makes the groups and writes their limits; raises OSError (and leaves nothing behind) if it cannot."""
        group = cls()
        name = f"{os.getpid()}-{next(_counter)}-{secrets.token_hex(3)}"
        try:
            for hierarchy in layout.hierarchies:
                parent = hierarchy.base / FOLDER
                parent.mkdir(exist_ok=True)
                if hierarchy.version == 2:
                    _enable(parent, hierarchy.controllers)
                _sweep(parent)
                folder = parent / name
                folder.mkdir()
                group.folders.append((hierarchy, folder))
                files = limit_files(hierarchy.version, quota)
                for controller in sorted(hierarchy.controllers):
                    for filename, value in files[controller]:
                        if (folder / filename).exists():  # swap files exist only with swap accounting
                            (folder / filename).write_text(value)
        except OSError:
            group.remove()
            raise
        return group

    @property
    def procs_files(self) -> list[str]:
        return [str(folder / "cgroup.procs") for _, folder in self.folders]

    def pids(self) -> set[int]:
        """Every process in the sandbox's groups (any one hierarchy holds them all)."""
        if not self.folders:
            return set()
        try:
            text = (self.folders[0][1] / "cgroup.procs").read_text()
        except OSError:
            return set()
        return {int(pid) for pid in text.split()}

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer ended in the sandbox (so far, or in all)."""
        for hierarchy, folder in self.folders:
            if "memory" not in hierarchy.controllers:
                continue
            events = folder / ("memory.events" if hierarchy.version == 2 else "memory.oom_control")
            with contextlib.suppress(OSError, ValueError):
                for line in events.read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        return self.oom_killed

    def read(self, controller: str, filename: str) -> str | None:
        """A file of the group that holds `controller` (for reports and tests)."""
        for hierarchy, folder in self.folders:
            if controller in hierarchy.controllers:
                with contextlib.suppress(OSError):
                    return (folder / filename).read_text().strip()
        return None

    def kill_all(self, timeout_s: float = REMOVE_WAIT_S) -> bool:
        """SIGKILL every process in the groups until none is left; False if some outlived `timeout_s`."""
        for hierarchy, folder in self.folders:
            if hierarchy.version == 2 and (folder / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (folder / "cgroup.kill").write_text("1")  # the kernel's own kill: no fork outruns it
                break
        return kill_until_gone(self.pids, lambda pid: True, timeout_s)

    def remove(self) -> None:
        """Kills what is left and removes the groups (whatever cannot be removed now is swept later)."""
        if not self.folders:
            return
        self.kill_all()
        self.oom_killed = self.oom_kills()
        for _, folder in self.folders:
            deadline = time.monotonic() + REMOVE_WAIT_S
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY: a process is still on its way out
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
        self.folders = []


def _enable(folder: Path, controllers: Iterable[str]) -> None:
    enabled = set((folder / "cgroup.subtree_control").read_text().split())
    for controller in set(controllers) - enabled:
        (folder / "cgroup.subtree_control").write_text(f"+{controller}")


def _sweep(parent: Path) -> None:
    """Removes the empty groups of sandboxes whose platform process died without removing them (once per
    folder and process)."""
    with _sweep_lock:
        if parent in _swept:
            return
        _swept.add(parent)
    for folder in parent.iterdir():
        owner = folder.name.split("-", 1)[0]
        if not folder.is_dir() or not owner.isdigit() or int(owner) == os.getpid() or _alive(int(owner)):
            continue
        with contextlib.suppress(OSError):
            if not (folder / "cgroup.procs").read_text().strip():
                folder.rmdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_until_gone(members, doomed, timeout_s: float) -> bool:
    """SIGKILLs the processes `members()` lists that `doomed(pid)` marks, again and again (a process may fork
    while its siblings die), until none is left or `timeout_s` passed; True when none is left."""
    deadline = time.monotonic() + timeout_s
    while True:
        targets = [pid for pid in members() if doomed(pid) and not dead(pid)]
        if not targets:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)


def dead(pid: int) -> bool:
    """Dead already (waiting for its parent to reap it), or gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"
