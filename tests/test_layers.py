"""The layer rules of docs/architecture.md, read from the source: which package may import which, no import
circle between packages or between modules, no module over 600 lines, Qt only in the tray's own package.

Every import counts, at the top of a module, inside a function or under TYPE_CHECKING: a circle closed by a
lazy import is still a circle.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tray_app"
MAX_LINES = 600
QT = ("PySide6", "shiboken6", "pyqtgraph")

# package -> the packages it must not import (a package is a folder of tray_app, or a top-level module)
FORBIDDEN = {
    "server": {"host", "supervisor", "ui"},
    "jobs": {"server", "host", "supervisor", "ui"},
    "supervisor": {"jobs", "server", "host", "ui"},
    "budget": {"supervisor", "jobs", "server", "host", "ui"},
    "device": {"budget", "supervisor", "jobs", "server", "host", "ui"},
    "engine": {"budget", "device", "library", "supervisor", "jobs", "server", "host", "ui"},
    "library": {"budget", "engine", "supervisor", "jobs", "server", "host", "ui"},
    "contract": {
        "config",
        "budget",
        "engine",
        "device",
        "library",
        "supervisor",
        "jobs",
        "server",
        "host",
        "ui",
    },
    "view": {"host", "server", "supervisor", "jobs", "ui"},
    # The tokenizer helper's two sides: the native one runs in the helper process, the other in the service.
    "tokenizer": {"budget", "device", "library", "supervisor", "jobs", "server", "host", "ui"},
    # Notifications and the signed links: told by events, asked by the server, wired by the host.
    "reach": {"host", "server", "supervisor", "jobs", "budget", "engine", "library", "ui"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def package_of(module: str) -> str:
    """`tray_app.jobs.intake` -> "jobs"; a top-level module is its own (`tray_app.config` -> "config")."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imported_names(module: str) -> Iterator[tuple[str, int]]:
    """Every module name an import statement of `module` names, with its line (relative imports resolved)."""
    path = modules()[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:  # `from tray_app.budget import planner` names the module planner
                submodule = f"{source}.{alias.name}"
                yield submodule if submodule in modules() else source, node.lineno


def resolve(name: str) -> str | None:
    """The tray_app module an imported name lives in (its longest known prefix), or None outside tray_app."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules():
            return candidate
    return None


@functools.cache
def module_graph() -> dict[str, dict[str, int]]:
    """module -> {imported tray_app module: a line importing it}."""
    graph: dict[str, dict[str, int]] = {}
    for module in modules():
        edges: dict[str, int] = {}
        for name, line in imported_names(module):
            target = resolve(name)
            # `tray_app` itself (the version) is the ground every module may stand on.
            if target is not None and target not in (module, "tray_app"):
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


def package_graph() -> dict[str, dict[str, str]]:
    """package -> {imported package: "module:line" of one import}."""
    graph: dict[str, dict[str, str]] = {}
    for module, edges in module_graph().items():
        for target, line in edges.items():
            source_package, target_package = package_of(module), package_of(target)
            if source_package != target_package and target != "tray_app":
                graph.setdefault(source_package, {}).setdefault(target_package, f"{module}:{line}")
    return graph


def circles(graph: dict[str, dict[str, object]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    nodes = sorted(set(graph) | {target for edges in graph.values() for target in edges})
    for root in nodes:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph.get(root, {}))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, {})))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_nothing_from_the_layers_it_must_not_see(package: str) -> None:
    edges = package_graph().get(package, {})
    broken = {target: where for target, where in edges.items() if target in FORBIDDEN[package]}
    assert not broken, f"{package}/ imports {', '.join(f'{t}/ ({w})' for t, w in sorted(broken.items()))}"


def test_the_contract_stands_on_nothing() -> None:
    """contract/ holds the words every layer shares: it imports no other part of tray_app."""
    assert package_graph().get("contract", {}) == {}


def test_no_import_circle_between_packages() -> None:
    graph = package_graph()
    found = circles(graph)  # type: ignore[arg-type]
    detail = [
        f"{' <-> '.join(circle)}: "
        + "; ".join(f"{a} -> {b} ({graph[a][b]})" for a in circle for b in circle if b in graph.get(a, {}))
        for circle in found
    ]
    assert not found, "\n".join(detail)


def test_no_import_circle_between_modules() -> None:
    graph = module_graph()
    found = circles(graph)  # type: ignore[arg-type]
    detail = [
        "; ".join(f"{a} -> {b} (line {graph[a][b]})" for a in circle for b in circle if b in graph[a])
        for circle in found
    ]
    assert not found, "\n".join(detail)


def test_no_module_is_over_600_lines() -> None:
    long = {
        module: lines
        for module, path in modules().items()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_only_the_tray_imports_qt() -> None:
    """The service (everything outside ui/) runs headless: no Qt, at the top or inside a function."""
    found = [
        f"{module}:{line} {name}"
        for module in modules()
        if package_of(module) != "ui"
        for name, line in imported_names(module)
        if name.split(".")[0] in QT
    ]
    assert not found, found


# The only modules that load llama.cpp's binding: the tokenizer helper's native side (and the log capture it
# uses), and the doctor, which runs in a process of its own. The service never loads it (issue 46):
# tests/server/test_crash_isolation.py reads its process's memory map to prove it.
NATIVE_BINDING = "llama_cpp"
BINDING_USERS = {
    "tray_app.tokenizer.counter",
    "tray_app.tokenizer.grammar",
    "tray_app.engine.llama_log",
    "tray_app.doctor.checks",
}


def test_only_the_tokenizer_helper_and_the_doctor_load_the_binding() -> None:
    users = {
        module
        for module in modules()
        for name, _ in imported_names(module)
        if name.split(".")[0] == NATIVE_BINDING
    }
    assert users == BINDING_USERS


def test_the_rules_see_real_imports() -> None:
    """The graph is not empty by mistake: the composition root reaches the HTTP layer and the jobs."""
    assert {"server", "jobs", "supervisor"} <= set(package_graph()["host"])
    assert circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
