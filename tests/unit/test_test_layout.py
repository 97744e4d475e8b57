"""The test suite's own layout, read from the source with `ast`: no test module imports another test module or
a conftest. Helpers that are not fixtures live in helper modules (tests/support/, a folder's helpers.py); a test
module imported by another is a second copy of its tests and fixtures, and a conftest imported by a test module
is a second copy of its module-level state."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.stack import REPO_ROOT

SCANNED = ("tests", "bench")


def _is_test_module(dotted: str) -> bool:
    """A module of the suite that pytest loads itself: `tests.….test_*` or `tests.….conftest`."""
    parts = dotted.split(".")
    return parts[0] == "tests" and (parts[-1].startswith("test_") or parts[-1] == "conftest")


def _package(path: Path) -> list[str]:
    """The dotted package a file under the repository is in (what a relative import is relative to)."""
    return list(path.relative_to(REPO_ROOT).parent.parts)


def imports_of_test_modules(source: str, path: Path) -> list[tuple[int, str]]:
    """(line, module) of each import in `source` (the file at `path`) of a test module or a conftest, the ones
    inside functions too; `from tests.x import test_y` counts as an import of `tests.x.test_y`."""
    found = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if _is_test_module(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package(path)
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            candidates = [module, *(f"{module}.{alias.name}" for alias in node.names)]
            found += [(node.lineno, name) for name in candidates if _is_test_module(name)]
    return sorted(found)


def test_no_test_module_imports_another():
    files = [path for folder in SCANNED for path in sorted((REPO_ROOT / folder).rglob("*.py"))]
    assert len(files) > 100  # the scan sees the suite (a wrong root would find nothing and pass)
    offences = [
        f"{path.relative_to(REPO_ROOT)}:{line} imports {module}"
        for path in files
        for line, module in imports_of_test_modules(path.read_text(), path)
    ]
    assert not offences, (
        "test modules and conftests import helpers from tests/support/ or a folder's helper module, never from a "
        "test module or a conftest:\n" + "\n".join(offences)
    )


def test_the_layout_check_sees_every_form_of_import():
    source = """
import tests.integration.test_run_lifecycle
from tests.e2e.conftest import screenshot
from tests.faults import conftest
from .test_rollout import random_policy
from . import conftest as here

def lazily():
    from tests.unit.engine.test_engine_run import comparable

from tests.support.api import Api
from tests.unit.platform.helpers import make_run
import tests.support.stack
"""
    path = REPO_ROOT / "tests" / "unit" / "engine" / "test_example.py"
    assert imports_of_test_modules(source, path) == [
        (2, "tests.integration.test_run_lifecycle"),
        (3, "tests.e2e.conftest"),
        (4, "tests.faults.conftest"),
        (5, "tests.unit.engine.test_rollout"),
        (6, "tests.unit.engine.conftest"),
        (9, "tests.unit.engine.test_engine_run"),
    ]
