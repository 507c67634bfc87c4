"""The layering rules of docs/architecture.md, checked on the source (imports inside functions
count too): imports point down, policies/ stays pure, and no two modules import each other."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("controller", "engines", "policies", "sim", "training", "loadgen")
# Standard-library modules that give a clock, files, sockets or processes.
IMPURE = {"time", "datetime", "socket", "pathlib", "os", "io", "subprocess", "threading"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found[_module_name(path)] = path
    return found


def _imports(name: str, path: Path) -> Iterator[str]:
    """Every module ``name`` imports, absolute, wherever the import statement is."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {m for m in _imports(name, path) if m in modules and m != name}
        for name, path in modules.items()
    }


def _top(module: str) -> str:
    return module.split(".")[0]


def test_engines_and_policies_never_import_the_daemon() -> None:
    upward = [
        f"{name} -> {dep}"
        for name, deps in _graph().items()
        for dep in deps
        if _top(name) in ("engines", "policies")
        and _top(dep) in ("controller", "sim", "training", "loadgen")
    ]
    assert upward == []


def test_policies_import_nothing_above_them() -> None:
    upward = [
        f"{name} -> {dep}"
        for name, deps in _graph().items()
        for dep in deps
        if _top(name) == "policies" and _top(dep) != "policies"
    ]
    assert upward == []


def test_policies_read_no_clock_files_or_sockets() -> None:
    impure = [
        f"{name} imports {module}"
        for name, path in _modules().items()
        if _top(name) == "policies"
        for module in _imports(name, path)
        if module.split(".")[0] in IMPURE
    ]
    assert impure == []


def test_only_the_cli_reaches_offline_packages() -> None:
    """The daemon never imports the simulator or the training code; its CLI commands may."""
    reached = [
        f"{name} -> {dep}"
        for name, deps in _graph().items()
        for dep in deps
        if _top(name) == "controller"
        and _top(dep) in ("sim", "training", "loadgen")
        and not name.startswith("controller.commands.")
    ]
    assert reached == []


def test_no_import_cycles() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []
