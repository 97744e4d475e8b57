"""Every name a package exports lazily (a module-level `__getattr__`, `rl_engine.lazy`) resolves: a renamed or
removed target fails here, not in a user's import."""

from __future__ import annotations

from importlib import import_module

import pytest

from tests.support.stack import REPO_ROOT


def lazy_packages() -> list[str]:
    """The packages of the engine and the SDK whose `__init__.py` defines a module `__getattr__`."""
    found = []
    for source_root, top in ((REPO_ROOT, "rl_engine"), (REPO_ROOT / "sdk", "posttrain_sdk")):
        for init in sorted((source_root / top).rglob("__init__.py")):
            if "__getattr__" in init.read_text():
                found.append(".".join(init.parent.relative_to(source_root).parts))
    return found


def test_the_engine_has_lazily_exporting_packages_to_check():
    assert {"rl_engine.algorithms", "rl_engine.distributed", "rl_engine.demo"} <= set(lazy_packages())


@pytest.mark.parametrize("package", lazy_packages())
def test_every_lazily_exported_name_resolves(package):
    module = import_module(package)
    names = getattr(module, "__all__", None)
    assert names, f"{package} exports lazily but has no __all__ to say what"
    unresolved = [name for name in names if not _resolves(module, name)]
    assert unresolved == [], f"{package} exports names that do not resolve: {unresolved}"


def _resolves(module, name: str) -> bool:
    try:
        getattr(module, name)
    except AttributeError:
        return False
    return True
