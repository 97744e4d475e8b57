"""The suite's own guard (tests/support/every_test_reported.py): a run in which a collected test never reported
fails, naming it, even though every test that did report passed; a whole run passes as before."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

TESTS = """
def test_one():
    pass

def test_swallowed():
    pass
"""

# Ends the protocol of one test without running or reporting it: what a worker that stops early does to the
# tests it had left.
SWALLOW = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    return True if item.name == "test_swallowed" else None
"""


def run_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.every_test_reported", "-p", "no:cacheprovider", *args],
        cwd=folder,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in-process", "xdist"])
def test_a_run_with_a_test_that_never_reported_fails_naming_it(tmp_path, workers):
    (tmp_path / "test_pair.py").write_text(TESTS)
    (tmp_path / "conftest.py").write_text(textwrap.dedent(SWALLOW))
    done = run_pytest(tmp_path, *workers)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "1 passed" in done.stdout
    assert "1 of 2 collected tests never reported" in done.stdout and "test_pair.py::test_swallowed" in done.stdout


def test_a_whole_run_passes(tmp_path):
    (tmp_path / "test_pair.py").write_text(TESTS)
    done = run_pytest(tmp_path, "-n", "2")
    assert done.returncode == 0, done.stdout[-2000:]
    assert "2 passed" in done.stdout and "never reported" not in done.stdout
