"""The import layering of docs/ARCHITECTURE.md ("One way down", "Apps import one way"), read from the source with
`ast`: every import statement counts, the ones inside functions too (a lazy import is still a dependency); only
imports under `if TYPE_CHECKING:` are left out, since they never run. An import of a submodule is an edge to the
packages above it too: Python runs their `__init__` first, and one that re-exports imports what it re-exports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {
    "rl_engine": REPO / "rl_engine",
    "posttrain": REPO / "platform" / "posttrain",
    "workers": REPO / "workers",
    "posttrain_sdk": REPO / "sdk" / "posttrain_sdk",
}
# (importer, imported): a package that must never import another, at any depth.
FORBIDDEN = [
    ("posttrain", "workers"),  # the platform sends tasks by name (posttrain.core.task_queue)
    ("rl_engine", "posttrain"),
    ("rl_engine", "workers"),
    ("rl_engine", "django"),
    ("posttrain_sdk", "posttrain"),
    ("posttrain_sdk", "rl_engine"),
    ("posttrain_sdk", "django"),
]
# Packages whose modules import each other in one direction only.
ACYCLIC = ("rl_engine", "posttrain", "workers")
# The platform's apps, lowest first (docs/ARCHITECTURE.md, "Apps import one way"): a module of one imports modules of
# the apps before it, never of one after it. What a lower app needs done by a higher one (a run's state change seen by
# telemetry and scheduling), the higher one registers as a hook (posttrain.runs.hooks, posttrain.telemetry.hooks).
APP_ORDER = ("core", "accounts", "projects", "registry", "runs", "telemetry", "scheduling", "review")


def _module_files() -> dict[str, Path]:
    modules = {}
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = _module_files()


def _is_type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name the module imports (`from a import b` gives `a` and `a.b`), relative ones resolved."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _is_type_checking_block(node):
            return
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return names


def _project_module(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


IMPORTS = {module: _imported_names(module, path) for module, path in MODULES.items()}


def _in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize(("importer", "imported"), FORBIDDEN, ids=[f"{a}-not-{b}" for a, b in FORBIDDEN])
def test_a_lower_layer_never_imports_a_higher_one(importer: str, imported: str) -> None:
    offending = sorted(
        f"{module} imports {name}"
        for module, names in IMPORTS.items()
        if _in_package(module, importer)
        for name in names
        if _in_package(name, imported)
    )
    assert offending == []


def _with_parent_packages(module: str) -> set[str]:
    """The module and every package above it that is a project module: importing `a.b.c` runs `a/__init__` and
    `a/b/__init__` first, and a package `__init__` that re-exports imports its submodules (and what they import)."""
    parts = module.split(".")
    return {".".join(parts[:n]) for n in range(1, len(parts) + 1)} & MODULES.keys()


def _project_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, and the packages above them whose `__init__` runs first, without
    the edges to a module's own parent packages (Python runs those first whatever the module imports)."""
    graph: dict[str, set[str]] = {}
    for module, names in IMPORTS.items():
        targets = {t for name in names if (p := _project_module(name)) for t in _with_parent_packages(p)}
        graph[module] = {t for t in targets - {module} if not module.startswith(t + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = _pop_component(stack, on_stack, node)
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _pop_component(stack: list[str], on_stack: set[str], node: str) -> list[str]:
    """The strongly connected component whose root is `node`: the stack's modules down to it, popped."""
    component = []
    while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
            break
    return component


def test_the_cycle_finder_finds_a_circle_through_a_lazy_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_an_import_of_a_submodule_is_an_edge_to_the_packages_above_it_too() -> None:
    # `from posttrain.runs.services.state_machine import …` runs posttrain/runs/services/__init__.py first, and with
    # it every module that package re-exports: the circle through a re-exporting __init__ is a real one.
    graph = _project_graph()
    assert {"posttrain.runs.services.state_machine", "posttrain.runs.services"} <= graph[
        "posttrain.telemetry.ingestion"
    ]
    assert "posttrain.runs.services" not in graph["posttrain.runs.services.launch"]  # its own package: already running


def _app_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "posttrain" and parts[1] in APP_ORDER else None


def test_the_app_order_names_every_app_as_installed_apps_lists_them() -> None:
    # INSTALLED_APPS' order is the order of the apps' ready(), so of their hooks: telemetry's live-channel message
    # goes out before scheduling's admission pass.
    from django.conf import settings

    assert {p.parent.name for p in PACKAGES["posttrain"].glob("*/apps.py")} == set(APP_ORDER)
    installed = [app.split(".")[1] for app in settings.INSTALLED_APPS if app.startswith("posttrain.")]
    assert installed == list(APP_ORDER)


def test_no_app_imports_an_app_after_it_in_the_order() -> None:
    rank = {app: i for i, app in enumerate(APP_ORDER)}
    upward = sorted(
        f"{module} ({importer}) imports {name} ({imported})"
        for module, names in IMPORTS.items()
        if (importer := _app_of(module))
        for name in names
        if (imported := _app_of(name)) and rank[imported] > rank[importer]
    )
    assert upward == []


def test_the_engine_the_platform_and_the_workers_have_no_import_circles() -> None:
    graph = _project_graph()
    circles = [c for c in _cycles(graph) if any(_in_package(m, p) for m in c for p in ACYCLIC)]
    assert circles == []


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("posttrain.runs.services", "workers.tasks"),
        ("rl_engine.loop", "rl_engine.distributed"),
        ("rl_engine.lora", "rl_engine.trainer"),
    ],
)
def test_the_formerly_circular_pairs_import_one_way_at_most(one: str, other: str) -> None:
    def imports(importer: str, imported: str) -> bool:
        return any(
            _in_package(module, importer) and any(_in_package(name, imported) for name in names)
            for module, names in IMPORTS.items()
        )

    assert not (imports(one, other) and imports(other, one))


@pytest.mark.parametrize("importer", ["posttrain", "workers"])
def test_the_platform_and_its_workers_use_the_engine_only_through_its_contract(importer: str) -> None:
    outside = sorted(
        f"{module} imports {name}"
        for module, names in IMPORTS.items()
        if _in_package(module, importer)
        for name in names
        if _in_package(name, "rl_engine") and not _in_package(name, "rl_engine.spec") and name != "rl_engine"
    )
    assert outside == []


def test_the_contract_imports_nothing_of_the_loop_the_trainers_or_the_generators() -> None:
    # What it re-exports stays out of the engine's deep-learning half (the import test proves it runs without it).
    heavy = ("rl_engine.loop", "rl_engine.trainer", "rl_engine.rollout", "rl_engine.distributed.roles")
    reached = _reachable(_project_graph(), {m for m in MODULES if _in_package(m, "rl_engine.spec")})
    assert sorted(m for m in reached if any(_in_package(m, h) for h in heavy)) == []


def _reachable(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    seen, todo = set(start), list(start)
    while todo:
        for child in graph.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen
