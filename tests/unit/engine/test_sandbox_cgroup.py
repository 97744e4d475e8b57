"""A sandbox's cgroup (rl_engine/sandbox/cgroup.py): the files its limits become on cgroup v1 and v2, and, where
this host has a writable hierarchy, the groups themselves (made, listed, killed, removed, swept)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from rl_engine.sandbox import cgroup as sandbox_cgroup
from rl_engine.sandbox.cgroup import Quota, SandboxCgroup, limit_files

PLAN = sandbox_cgroup.plan()
needs_cgroups = pytest.mark.skipif(not PLAN.hierarchies, reason=f"no writable cgroup here: {PLAN.detail}")


def test_limits_become_the_v2_files():
    files = limit_files(2, Quota(memory_bytes=128 << 20, pids=66, cpus=1.5))
    assert files == {
        "memory": [("memory.max", "134217728"), ("memory.swap.max", "0")],
        "pids": [("pids.max", "66")],
        "cpu": [("cpu.max", "150000 100000")],
    }


def test_limits_become_the_v1_files_memory_before_its_swap_limit():
    files = limit_files(1, Quota(memory_bytes=64 << 20, pids=10, cpus=0.25))
    assert files == {
        "memory": [("memory.limit_in_bytes", "67108864"), ("memory.memsw.limit_in_bytes", "67108864")],
        "pids": [("pids.max", "10")],
        "cpu": [("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "25000")],
    }


def test_a_tiny_cpu_quota_stays_above_the_kernels_minimum():
    assert limit_files(2, Quota(1 << 20, 1, 0.001))["cpu"] == [("cpu.max", "1000 100000")]


def test_the_plan_describes_what_limits_a_sandbox_here():
    text = PLAN.detail
    if PLAN.missing:
        assert f"not limited: {', '.join(PLAN.missing)}" in text
    else:
        assert "memory" in text and "pids" in text and "cpu" in text and "not limited" not in text


@needs_cgroups
def test_a_group_lists_its_processes_kills_them_all_and_is_removed():
    group = SandboxCgroup.create(PLAN, Quota(256 << 20, 16, 1.0))
    folders = [folder for _, folder in group.folders]
    procs = group.procs_files
    # A process that joins the groups itself (as the sandbox's launcher does), then forks a child.
    code = (
        "import os, sys, time\n"
        "for path in sys.argv[1:]:\n    open(path, 'w').write('0')\n"
        "if os.fork() == 0:\n    time.sleep(60)\n    os._exit(0)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, *procs])
    try:
        deadline = time.monotonic() + 10
        while len(group.pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.pid in group.pids() and len(group.pids()) == 2
        assert group.kill_all(timeout_s=5)
        assert proc.wait(timeout=5) == -9
    finally:
        proc.kill()
        proc.wait()
        group.remove()
    assert group.folders == [] and not any(folder.exists() for folder in folders)


@needs_cgroups
def test_groups_left_by_a_platform_process_that_died_are_swept(monkeypatch):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    hierarchy = PLAN.hierarchies[0]
    parent = hierarchy.base / sandbox_cgroup.FOLDER
    parent.mkdir(exist_ok=True)
    stale = parent / f"{gone.pid}-1-abcdef"
    stale.mkdir()
    mine = parent / f"{os.getpid()}-999-abcdef"  # this process's own: never swept from under it
    mine.mkdir()
    try:
        monkeypatch.setattr(sandbox_cgroup, "_swept", set())
        SandboxCgroup.create(PLAN, Quota(64 << 20, 4, 1.0)).remove()
        assert not stale.exists() and mine.exists()
    finally:
        for folder in (stale, mine):
            if folder.exists():
                folder.rmdir()
