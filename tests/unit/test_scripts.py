"""scripts/: `make install` and `make test` install Debian packages through apt_install.sh, which waits for apt's
locks when another install holds them instead of failing at once; demo.sh gives the Ray head the machine's CPUs and
starts the web server with the flags the test stack's web server and the benches read from it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.stack import REPO_ROOT

HELPER = REPO_ROOT / "scripts" / "apt_install.sh"
APT_CALL = re.compile(r"(^|[\s;&|(])(apt-get|apt)\s+\S")

HOLD_LOCKS = """
import fcntl, os, sys, time
fds = [os.open(path, os.O_RDWR | os.O_CREAT, 0o640) for path in sys.argv[2:]]
for fd in fds:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
time.sleep(float(sys.argv[1]))
"""


def apt_calls(path: Path) -> list[str]:
    return [
        line.strip()
        for line in path.read_text().splitlines()
        if not line.lstrip().startswith("#") and APT_CALL.search(line.split(" #", 1)[0])
    ]


def test_only_the_helper_calls_apt_and_it_waits_for_the_lock():
    callers = {
        path.name: apt_calls(path) for path in [*sorted((REPO_ROOT / "scripts").glob("*.sh")), REPO_ROOT / "Makefile"]
    }
    assert {name for name, calls in callers.items() if calls} == {"apt_install.sh"}, callers
    assert 'apt=(apt-get -o "DPkg::Lock::Timeout=$timeout_s"' in HELPER.read_text()
    assert 'timeout_s="${APT_LOCK_TIMEOUT_S:-120}"' in HELPER.read_text()
    for name in ("ensure_bubblewrap.sh", "ensure_chromium.sh"):
        assert "apt_install.sh" in (REPO_ROOT / "scripts" / name).read_text(), name


@pytest.fixture
def private_apt(tmp_path: Path) -> tuple[dict[str, str], list[Path]]:
    """apt pointed at folders of this test (no sources, its own lists, cache and dpkg state): its locks are
    this test's to hold, and nothing is fetched. Returns the helper's environment and the two lock files."""
    if shutil.which("apt-get") is None:
        pytest.skip("apt-get is not installed (the scripts are for Debian hosts)")
    (tmp_path / "sources.list").write_text("")
    for folder in ("sources.list.d", "lists/partial", "cache/archives/partial", "dpkg"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "dpkg" / "status").write_text("")
    options = {
        "Dir::Etc::sourcelist": tmp_path / "sources.list",
        "Dir::Etc::sourceparts": tmp_path / "sources.list.d",
        "Dir::State::Lists": tmp_path / "lists",
        "Dir::Cache": tmp_path / "cache",
        "Dir::State::status": tmp_path / "dpkg" / "status",
    }
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "APT_OPTIONS": " ".join(f"-o {key}={value}" for key, value in options.items()),
        "APT_LOCK_TIMEOUT_S": "30",
    }
    return env, [tmp_path / "lists" / "lock", tmp_path / "dpkg" / "lock-frontend"]


def held_for(seconds: float, locks: list[Path]) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCKS, str(seconds), *map(str, locks)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_the_helper_waits_for_the_package_lists_lock_another_install_holds(private_apt):
    env, (lists_lock, _) = private_apt
    holder = held_for(3, [lists_lock])
    started = time.monotonic()
    done = subprocess.run([str(HELPER)], env=env, capture_output=True, text=True, timeout=60)
    waited = time.monotonic() - started
    holder.wait()
    assert done.returncode == 0, done.stderr
    assert waited >= 2.5 and "waiting for it" in done.stderr


def test_the_helper_waits_for_dpkgs_lock_another_install_holds(private_apt):
    env, (_, dpkg_lock) = private_apt
    holder = held_for(3, [dpkg_lock])
    started = time.monotonic()
    # No source lists a package here: once apt got the lock it says so, which shows it waited rather than gave up.
    done = subprocess.run([str(HELPER), "no-such-package"], env=env, capture_output=True, text=True, timeout=60)
    waited = time.monotonic() - started
    holder.wait()
    assert waited >= 2.5, done.stderr
    assert "Could not get lock" not in done.stderr and "Unable to locate package no-such-package" in done.stderr


def test_a_failure_other_than_the_lock_is_reported_at_once(private_apt):
    env, _ = private_apt
    env = {**env, "APT_OPTIONS": env["APT_OPTIONS"] + " -o Dir::State::Lists=/nonexistent/lists"}
    started = time.monotonic()
    done = subprocess.run([str(HELPER)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and time.monotonic() - started < 10 and "waiting" not in done.stderr


@pytest.mark.parametrize("omp_threads", ["1", "7"])
def test_the_demo_stacks_ray_head_gets_the_machines_cpus_whatever_omp_num_threads_says(omp_threads):
    """GNU nproc prints OMP_NUM_THREADS when it is set: the head had 1 CPU where it was 1, and the demo
    experiment (2 CPUs) waited in the queue for ever."""
    demo = (REPO_ROOT / "scripts" / "demo.sh").read_text()
    assert '--num-cpus "$(cpus)"' in demo
    (definition,) = [line for line in demo.splitlines() if line.startswith("cpus()")]
    done = subprocess.run(
        ["bash", "-c", f"{definition}\ncpus"],
        env={**os.environ, "OMP_NUM_THREADS": omp_threads},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and int(done.stdout) == len(os.sched_getaffinity(0)), done


def test_the_demo_web_server_is_started_with_the_flags_the_test_stack_reads_from_the_same_line():
    """One line of demo.sh holds uvicorn's parser and limits (docs/SECURITY.md, "Request bodies"); the demo's web
    server is started with it, and bench/_servers.demo_web_flags (which tests/support/stack.py uses) reads it."""
    from bench._servers import demo_web_flags

    demo = (REPO_ROOT / "scripts" / "demo.sh").read_text()
    (launch,) = [line for line in demo.splitlines() if line.strip().startswith("launch web ")]
    assert launch.endswith("\\") and '"${WEB_FLAGS[@]}"' in demo.split(launch, 1)[1].splitlines()[1]
    flags = demo_web_flags()
    assert dict(zip(flags[::2], flags[1::2], strict=True)) == {
        "--http": "h11",
        "--h11-max-incomplete-event-size": str(1 << 20),
        "--limit-concurrency": "200",
    }
