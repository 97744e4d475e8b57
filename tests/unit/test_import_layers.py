"""The import layering of docs/ARCHITECTURE.md ("One way down"), read from the source with `ast`: every import
statement counts, the ones inside functions too (a lazy import is still a dependency); only imports under
`if TYPE_CHECKING:` are left out, since they never run."""

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


def _project_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, without the edges to a module's own parent packages
    (Python runs those first whatever the module imports)."""
    graph: dict[str, set[str]] = {}
    for module, names in IMPORTS.items():
        targets = {_project_module(name) for name in names} - {None, module}
        graph[module] = {t for t in targets if t is not None and not module.startswith(t + ".")}
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
