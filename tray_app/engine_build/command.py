"""`failsoft engine build|use|status`: install the engine into this environment, point Failsoft at your own
`llama-server`, or say which one it runs.

Exit status: 0 done (status: the engine is usable), 1 it could not be done (the message says why and what to
run), 2 a wrong argument.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tray_app import config, paths
from tray_app.engine import binary
from tray_app.engine_build import build as builder
from tray_app.engine_build.installed import binding_version, in_virtual_env, installed_variant

BUILD_FIX = "failsoft engine build"
USE_FIX = "failsoft engine use PATH"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    engine = sub.add_parser("engine", help="build, choose or show the llama.cpp engine (llama-server)")
    actions = engine.add_subparsers(dest="engine_command", required=True)
    build = actions.add_parser(
        "build",
        help="compile llama.cpp (binding + llama-server) once for this machine's GPU and install it here; "
        "a build already in the cache takes seconds",
    )
    build.add_argument(
        "--backend",
        choices=builder.BACKENDS,
        help="the GPU backend (default: $GPU_BACKEND, else the GPU this machine has and can build for)",
    )
    build.add_argument(
        "--source", type=Path, help="build from this llama-cpp-python sdist (archive or folder)"
    )
    build.add_argument("--offline", action="store_true", help="ask no package index (needs --source)")
    build.add_argument("--build-dir", type=Path, help="keep CMake's build folder here (a rerun resumes)")
    use = actions.add_parser(
        "use", help="run your own llama-server build (checked first); written to the config"
    )
    target = use.add_mutually_exclusive_group(required=True)
    target.add_argument("path", nargs="?", type=Path, help="the llama-server binary")
    target.add_argument("--bundled", action="store_true", help="back to the one `engine build` installed")
    status = actions.add_parser("status", help="which llama-server runs: its build, backend and commit")
    status.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    handlers = {"build": build, "use": use, "status": status}
    return handlers[args.engine_command](args)


def build(args: argparse.Namespace) -> int:
    if not in_virtual_env():
        print(
            "failsoft engine build: this Failsoft is not in a virtual environment, and the engine is "
            "installed beside it: install Failsoft with pipx (pipx install failsoft) or into a venv",
            file=sys.stderr,
        )
        return 1
    try:
        backend = args.backend or builder.detect_backend()
        builder.build_and_install(
            backend,
            venv=Path(sys.prefix),
            python=sys.executable,
            source=args.source,
            offline=args.offline,
            build_dir=args.build_dir,
        )
    except builder.BuildError as error:
        builder.say(f"error: {error}")
        return 1
    except subprocess.CalledProcessError as error:
        builder.say(f"error: {' '.join(map(str, error.cmd))} failed with exit status {error.returncode}")
        return 1
    importlib.invalidate_caches()  # the llama_cpp package was just (re)installed under this interpreter
    server = builder.installed_server(Path(sys.prefix))
    if server is None:
        builder.say("error: the installed build has no llama-server")
        return 1
    try:
        info = binary.inspect(server)
    except binary.EngineError as error:
        builder.say(f"error: {error}")
        return 1
    builder.say(f"ready: {info.describe()} at {info.path}")
    own = _configured_server()
    if own:
        builder.say(f"note: engine.llama_server = {own} in {paths.config_file()} stays in use; "
                    "`failsoft engine use --bundled` switches to this build")  # fmt: skip
    return 0


def _configured_server() -> str:
    try:
        return config.load().engine.llama_server
    except config.ConfigError:
        return ""


def use(args: argparse.Namespace) -> int:
    value = ""
    if not args.bundled:
        path = Path(args.path).expanduser().resolve()
        try:
            info = binary.inspect(path)
        except binary.EngineError as error:
            print(f"failsoft engine use: {error}", file=sys.stderr)
            return 1
        value = str(path)
        said = f"{info.describe()} at {path}"
    else:
        if binary.bundled_server() is None:
            print(
                f"failsoft engine use: no engine is installed here: run `{BUILD_FIX}` first", file=sys.stderr
            )
            return 1
        said = "the llama-server that `failsoft engine build` installed"
    target = paths.config_file()
    try:
        config.edit_file(target, {"engine": {"llama_server": value}})
    except config.ConfigError as error:
        print(f"failsoft engine use: {error}", file=sys.stderr)
        return 1
    print(f"engine.llama_server in {target}: {said}")
    if binding_version() is None:
        print(
            f"the Python binding (llama-cpp-python) is not installed, and the service needs it: {BUILD_FIX}"
        )
    print("a running service takes it at its next start")
    return 0


def engine_report(configured: str) -> dict[str, Any]:
    """What `status` shows: the binary in use and where it comes from, the binding, the cached builds."""
    report: dict[str, Any] = {
        "ok": True,
        "configured": configured,
        "installed_build": installed_variant(),  # variant, version (llama-cpp-python's), backend
        "binding": binding_version(),
        "server": None,
    }
    try:
        report["server"] = binary.find(configured).to_dict()
    except binary.EngineError as error:
        report.update(ok=False, error=str(error), fix=f"{BUILD_FIX} (or {USE_FIX} for your own llama-server)")
    if report["binding"] is None:
        report.update(ok=False, fix=BUILD_FIX)  # the service's tokenizer needs it, whichever server runs
    report["cached_builds"] = sorted(
        folder.name
        for folder in builder.cache_root().glob("llama-cpp-python-*")
        if any(folder.glob("llama_cpp_python-*.whl"))
    )
    try:
        report["backend_to_build"] = builder.detect_backend()
    except builder.BuildError as error:
        report["backend_to_build"] = str(error)
    return report


def status(args: argparse.Namespace) -> int:
    try:
        configured = config.load().engine.llama_server
    except config.ConfigError as error:
        print(f"failsoft: {error}", file=sys.stderr)
        return 2
    report = engine_report(configured)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0 if report["ok"] else 1


def _origin(report: dict[str, Any]) -> str:
    build = report["installed_build"]
    if report["configured"]:
        return f"your own build (engine.llama_server in {paths.config_file()})"
    if build.get("backend"):
        return f"`failsoft engine build`: llama-cpp-python {build['version']} for {build['backend']}"
    return "llama-cpp-python's own folder (not installed by `failsoft engine build`: backend unknown)"


def render(report: dict[str, Any]) -> str:
    server = report["server"]
    if server is not None:
        lines = [
            f"llama-server {server['version']} (build {server['build']}, commit {server['commit']})",
            f"  at    {server['path']}",
            f"  from  {_origin(report)}",
        ]
    else:
        lines = [f"no usable llama-server: {report['error']}"]
    binding = report["binding"]
    lines.append(
        f"binding: llama-cpp-python {binding}" if binding else "binding: llama-cpp-python not installed"
    )
    cached = ", ".join(report["cached_builds"]) or "none"
    lines.append(f"cached builds in {builder.cache_root()}: {cached}")
    lines.append(f"`failsoft engine build` here builds for: {report['backend_to_build']}")
    if not report["ok"]:
        lines.append(f"fix: {report['fix']}")
    return "\n".join(lines)
