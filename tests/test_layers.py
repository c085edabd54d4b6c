"""The layer rules of docs/architecture.md, read from the source: which package may import which, no import
circle between packages or between modules, no module over 600 lines, Qt only in the tray's own package.

Every import counts, at the top of a module, inside a function or under TYPE_CHECKING: a circle closed by a
lazy import is still a circle. So does an import by name: `importlib.import_module("tray_app.x")` and the
dispatcher's "tray_app.module:function" strings (cli.HANDLERS) are edges like any `import`.
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping
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
    # Other machines' servers as workers: they stand on the config and the contract; the engine takes a
    # Peer as a Worker by its shape, the host wires them in.
    "peers": {
        "server",
        "host",
        "supervisor",
        "jobs",
        "ui",
        "library",
        "budget",
        "device",
        "engine",
        "reach",
        "tokenizer",
        "view",
        "console",
        "cli",
    },
}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package at `package` (tray_app, or a copy of it with a violation planted)."""
    return {module_name(path, package): path for path in sorted(package.rglob("*.py"))}


def package_of(module: str) -> str:
    """`tray_app.jobs.intake` -> "jobs"; a top-level module is its own (`tray_app.cli` -> "cli")."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


# "tray_app.host.serve_command:run": a module named with the function to call in it (the dispatcher's table).
HANDLER_STRING = re.compile(r"tray_app(?:\.\w+)+:\w+")
IMPORT_BY_NAME = ("import_module", "__import__")


def imported_by_name(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """The modules a module imports by a string: `importlib.import_module("tray_app....")` (or `__import__`)
    and every "tray_app.module:function" string, which the dispatcher resolves with import_module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            function = node.func
            called = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
            first = node.args[0]
            if called in IMPORT_BY_NAME and isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield first.value, node.lineno
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and HANDLER_STRING.fullmatch(node.value)
        ):
            yield node.value.partition(":")[0], node.lineno


def imported_names(module: str, package: Path = PACKAGE) -> Iterator[tuple[str, int]]:
    """Every module name `module` imports, by a statement or by a string, with its line (relative imports
    resolved)."""
    path = modules(package)[module]
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
                yield submodule if submodule in modules(package) else source, node.lineno
    yield from imported_by_name(tree)


def resolve(name: str, package: Path = PACKAGE) -> str | None:
    """The tray_app module an imported name lives in (its longest known prefix), or None outside tray_app."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules(package):
            return candidate
    return None


@functools.cache
def module_graph(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported tray_app module: a line importing it}."""
    graph: dict[str, dict[str, int]] = {}
    for module in modules(package):
        edges: dict[str, int] = {}
        for name, line in imported_names(module, package):
            target = resolve(name, package)
            # `tray_app` itself (the version) is the ground every module may stand on.
            if target is not None and target not in (module, "tray_app"):
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


def package_graph(package: Path = PACKAGE) -> dict[str, dict[str, str]]:
    """package -> {imported package: "module:line" of one import}."""
    graph: dict[str, dict[str, str]] = {}
    for module, edges in module_graph(package).items():
        for target, line in edges.items():
            source_package, target_package = package_of(module), package_of(target)
            if source_package != target_package and target != "tray_app":
                graph.setdefault(source_package, {}).setdefault(target_package, f"{module}:{line}")
    return graph


def forbidden_imports(graph: Mapping[str, Mapping[str, str]], package: str) -> dict[str, str]:
    """The packages `package` imports though FORBIDDEN says it must not, with where."""
    return {target: where for target, where in graph.get(package, {}).items() if target in FORBIDDEN[package]}


def unknown_packages(forbidden: Mapping[str, Iterable[str]], package: Path = PACKAGE) -> list[str]:
    """The names in the rules that are neither a folder nor a module of the package: a renamed package
    must not leave its rule silently true."""
    named = set(forbidden) | {name for names in forbidden.values() for name in names}
    return sorted(
        name for name in named if not (package / name).is_dir() and not (package / f"{name}.py").is_file()
    )


# The front door starts the tray: `failsoft` alone runs tray_app.ui.app (a string in cli.HANDLERS).
TRAY_DOORS = {"tray_app.__main__", "tray_app.cli"}


def qt_paths(
    graph: Mapping[str, Iterable[str]], qt_modules: set[str], doors: set[str] = TRAY_DOORS
) -> dict[str, list[str]]:
    """module outside ui/ -> the import path by which it reaches a ui/ module or a module importing Qt."""
    found: dict[str, list[str]] = {}
    for start in sorted(graph):
        if package_of(start) == "ui" or start in doors:
            continue
        previous: dict[str, str] = {}
        queue, seen = [start], {start}
        while queue:
            node = queue.pop(0)
            if node != start and (package_of(node) == "ui" or node in qt_modules):
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                found[start] = path[::-1]
                break
            for target in sorted(graph.get(node, ())):
                if target not in seen:
                    seen.add(target)
                    previous[target] = node
                    queue.append(target)
    return found


def direct_qt_importers(package: Path = PACKAGE) -> set[str]:
    return {
        module
        for module in modules(package)
        for name, _ in imported_names(module, package)
        if name.split(".")[0] in QT
    }


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
    broken = forbidden_imports(package_graph(), package)
    assert not broken, f"{package}/ imports {', '.join(f'{t}/ ({w})' for t, w in sorted(broken.items()))}"


def test_the_contract_stands_on_nothing() -> None:
    """contract/ holds the words every layer shares: it imports no other part of tray_app."""
    assert package_graph().get("contract", {}) == {}


# The HTTP layer's doors into the job engine: the facade and its request types, the outcomes a stream is
# made of, the job record it reads, and the chunk shapes a stored answer is streamed in.
JOBS_DOORS = {
    "tray_app.jobs.intake",
    "tray_app.jobs.outcomes",
    "tray_app.jobs.registry",
    "tray_app.jobs.assemble",
}


def jobs_modules_the_server_imports(package: Path = PACKAGE) -> set[str]:
    graph = module_graph(package)
    return {
        target
        for module, targets in graph.items()
        if module.startswith("tray_app.server.")
        for target in targets
        if target.startswith("tray_app.jobs.")
    }


def test_the_server_enters_the_jobs_engine_by_its_doors() -> None:
    assert jobs_modules_the_server_imports() <= JOBS_DOORS


ENGINE_PARTS = {"registry", "executor", "slots", "journal", "embeddings", "path_timings", "desk"}


def engine_parts_the_server_reaches(package: Path = PACKAGE) -> list[str]:
    return [
        f"{module_name(path, package)}:{node.lineno} .{node.attr}"
        for path in (package / "server").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in ENGINE_PARTS and _is_service_or_jobs(node.value)
    ]


def test_the_server_reaches_no_engine_part_past_the_facade() -> None:
    """The registry, executor, slots, journal and embeddings runner are the facade's: the HTTP layer asks
    `Jobs` (a read, a stream, a note), it never changes a job's state itself."""
    assert engine_parts_the_server_reaches() == []


def _is_service_or_jobs(node: ast.expr) -> bool:
    """`svc.X`, `self.svc.X`, `service.X`, `self.jobs.X`, `jobs.X`, `self.router.svc.X`."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name in {"svc", "service", "jobs"}


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


def test_nothing_outside_the_tray_reaches_qt_through_other_modules() -> None:
    """No service module imports, through any chain of imports, a ui/ module or a module that imports Qt;
    only the front door (`failsoft` without a subcommand starts the tray) leads there."""
    found = qt_paths(module_graph(), direct_qt_importers())
    assert not found, {module: " -> ".join(path) for module, path in found.items()}


def test_every_package_the_rules_name_exists() -> None:
    assert unknown_packages(FORBIDDEN) == []


def test_only_main_imports_the_dispatcher() -> None:
    """The commands read their config from tray_app.config, not from cli.py: the dispatcher names them, so a
    command importing it back would close a circle through the dispatcher's strings."""
    importers = {module for module, edges in module_graph().items() if "tray_app.cli" in edges}
    assert importers == {"tray_app.__main__"}


def test_the_dispatcher_strings_are_edges() -> None:
    """cli.HANDLERS' "module:function" strings count as imports: the front door reaches every command."""
    edges = module_graph()["tray_app.cli"]
    assert {"tray_app.ui.app", "tray_app.host.serve_command", "tray_app.config.command"} <= set(edges)


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


# The rules fire: each planted violation, in a copy of tray_app or in a graph made up for the purpose.


@pytest.fixture
def copy_of_the_package(tmp_path: Path) -> Path:
    """The source of tray_app (its .py files) in a folder of its own, to plant a violation in."""
    copy = tmp_path / "tray_app"
    for path in PACKAGE.rglob("*.py"):
        target = copy / path.relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return copy


def plant(copy: Path, module: str, code: str) -> None:
    path = copy / module
    path.write_text(path.read_text(encoding="utf-8") + "\n\n" + code, encoding="utf-8")
    module_graph.cache_clear()  # the copy's graph, read again with the violation


def test_an_import_by_name_is_caught(copy_of_the_package: Path) -> None:
    assert forbidden_imports(package_graph(copy_of_the_package), "server") == {}
    plant(
        copy_of_the_package,
        "server/openai.py",
        "def _service():\n    import importlib\n    return importlib.import_module('tray_app.host.service')",
    )
    assert set(forbidden_imports(package_graph(copy_of_the_package), "server")) == {"host"}


def test_a_dispatcher_string_closing_a_circle_is_caught(copy_of_the_package: Path) -> None:
    """A command that imports the dispatcher back closes a circle only the strings show."""
    assert circles(module_graph(copy_of_the_package)) == []  # type: ignore[arg-type]
    plant(copy_of_the_package, "doctor/command.py", "def _door():\n    from tray_app import cli\n")
    found = circles(module_graph(copy_of_the_package))  # type: ignore[arg-type]
    assert any({"tray_app.cli", "tray_app.doctor.command"} <= set(circle) for circle in found), found


def test_a_package_that_no_longer_exists_is_caught(copy_of_the_package: Path) -> None:
    assert unknown_packages(FORBIDDEN, copy_of_the_package) == []
    (copy_of_the_package / "reach").rename(copy_of_the_package / "outreach")
    assert unknown_packages(FORBIDDEN, copy_of_the_package) == ["reach"]
    assert unknown_packages({"jobs": {"sever"}}) == ["sever"]


def test_qt_reached_through_other_modules_is_caught(copy_of_the_package: Path) -> None:
    graph = {
        "tray_app.host.a": {"tray_app.view.b": 1},
        "tray_app.view.b": {"tray_app.view.chart": 1},
        "tray_app.view.chart": {},
        "tray_app.console.c": {"tray_app.ui.window": 1},
        "tray_app.ui.window": {"tray_app.view.b": 1},
        "tray_app.cli": {"tray_app.ui.window": 1},
    }
    assert qt_paths(graph, {"tray_app.view.chart"}) == {
        "tray_app.host.a": ["tray_app.host.a", "tray_app.view.b", "tray_app.view.chart"],
        "tray_app.view.b": ["tray_app.view.b", "tray_app.view.chart"],
        "tray_app.console.c": ["tray_app.console.c", "tray_app.ui.window"],
    }
    plant(copy_of_the_package, "console/command.py", "def _tray():\n    from tray_app.ui import app\n")
    found = qt_paths(module_graph(copy_of_the_package), direct_qt_importers(copy_of_the_package))
    assert found["tray_app.console.command"][-1] == "tray_app.ui.app"


def test_a_server_module_past_the_jobs_doors_is_caught(copy_of_the_package: Path) -> None:
    code = "from tray_app.jobs.engine import Executor\n\n\ndef drop(svc, job):\n    svc.registry.fail(job)\n"
    plant(copy_of_the_package, "server/health.py", code)
    assert jobs_modules_the_server_imports(copy_of_the_package) - JOBS_DOORS == {"tray_app.jobs.engine"}
    (reached,) = engine_parts_the_server_reaches(copy_of_the_package)
    assert reached.startswith("tray_app.server.health:") and reached.endswith(" .registry")
