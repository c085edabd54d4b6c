"""`failsoft models` (the configured models and the GGUF files other programs put on this machine) and
`failsoft models add NAME` (one of them into the config, by path: nothing is copied).

`add` makes the model the main one when there is none yet (no model.path and no bundled model), or with
--main; otherwise it becomes a `[[models]]` entry, loaded when a request names it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tray_app import config, paths
from tray_app.library.catalog import catalog_from_config
from tray_app.library.discovery import SOURCES, FoundModel, discover, is_gguf
from tray_app.sizes import format_size


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    models = sub.add_parser(
        "models", help="the configured models, and GGUF files found from Ollama, LM Studio, the HF cache"
    )
    models.add_argument("--json", action="store_true", help="print one JSON object")
    actions = models.add_subparsers(dest="models_command")
    add = actions.add_parser("add", help="put a found model (or a GGUF file) in the library, without copying")
    add.add_argument("name", help="a name `failsoft models` lists, or the path of a GGUF file")
    add.add_argument("--as", dest="alias", metavar="NAME", help="the name requests use (default: NAME)")
    add.add_argument(
        "--from", dest="source", choices=SOURCES, help="when two stores have a model of that name"
    )
    add.add_argument("--main", action="store_true", help="make it the main model (model.path)")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "models_command", None) == "add":
        return add(args)
    return show(args)


def configured(cfg: config.Config) -> list[dict[str, Any]]:
    """The main model (when there is one) and the library's, as `failsoft models` lists them."""
    try:
        entries = catalog_from_config(cfg).entries
    except config.ConfigError:
        entries = []  # no main model yet, or a [[models]] file missing: list what the file says
    if entries:
        return [
            {"name": entry.name, "path": str(entry.path), "role": "main" if entry.main else "library"}
            for entry in entries
        ]
    listed = [{"name": model.name, "path": model.path, "role": "library"} for model in cfg.models]
    if cfg.model.path:
        listed.insert(0, {"name": Path(cfg.model.path).name, "path": cfg.model.path, "role": "main"})
    return listed


def show(args: argparse.Namespace) -> int:
    cfg = config.load()
    mine = configured(cfg)
    taken = {str(Path(item["path"]).expanduser().resolve()) for item in mine}
    found = [model for model in discover() if str(model.path.resolve()) not in taken]
    if args.json:
        print(json.dumps({"configured": mine, "found": [model.to_dict() for model in found]}, indent=2))
        return 0
    print(f"configured ({cfg.source or paths.config_file()}):")
    for item in mine:
        print(f"  {item['role']:<8} {item['name']:<36} {item['path']}")
    if not mine:
        print("  none (and the bundled model is not installed)")
    print()
    if not found:
        print("found on this machine: none (looked in Ollama's store, LM Studio's models, the HF cache)")
        return 0
    print("found on this machine (add one: failsoft models add NAME):")
    print(render_found(found))
    return 0


def render_found(found: list[FoundModel], limit: int = 0) -> str:
    shown = found[:limit] if limit else found
    lines = [
        f"  {model.name:<36} {model.source:<9} {format_size(model.size):>10}  {model.path}" for model in shown
    ]
    if len(found) > len(shown):
        lines.append(f"  ... and {len(found) - len(shown)} more: failsoft models")
    return "\n".join(lines)


class AddError(Exception):
    """What `models add` cannot do; the message says why and what to type instead."""


def pick(name: str, source: str | None, found: list[FoundModel]) -> FoundModel:
    """The found model `name` means: a GGUF file's path, or a name `failsoft models` lists."""
    path = Path(name).expanduser()
    if path.suffix == ".gguf" or path.is_file():
        if not path.is_file():
            raise AddError(f"no file {path}")
        if not is_gguf(path):
            raise AddError(f"{path} is not a GGUF file")
        return FoundModel(path.stem, path.resolve(), "file", str(path), path.stat().st_size)
    matches = [model for model in found if model.name == name and source in (None, model.source)]
    if not matches:
        raise AddError(f"no model named {name!r} was found; `failsoft models` lists the names")
    if len(matches) > 1:
        where = ", ".join(f"--from {model.source} ({model.path})" for model in matches)
        raise AddError(f"{name!r} is in more than one store; say which: {where}")
    return matches[0]


def _has_main(cfg: config.Config) -> bool:
    return bool(cfg.model.path) or paths.bundled_model_path() is not None


def add(args: argparse.Namespace) -> int:
    target = paths.config_file()
    try:
        cfg = config.load(target)
        model = pick(args.name, args.source, discover())
        written, said = _add_to(cfg, model, args.alias or model.name, args.main)
    except (AddError, config.ConfigError) as error:
        print(f"failsoft models add: {error}", file=sys.stderr)
        return 1
    if written:
        config.edit_file(target, written)
    print(f"{said} in {target} (the file stays where it is: {model.path})")
    print("a running service takes it at its next start")
    return 0


def _add_to(cfg: config.Config, model: FoundModel, name: str, main: bool) -> tuple[dict[str, Any], str]:
    """The config change that adds `model` (nothing when it is configured already) and what to say."""
    resolved = model.path.resolve()
    for item in configured(cfg):
        if Path(item["path"]).expanduser().resolve() == resolved and not (main and item["role"] != "main"):
            return {}, f"{item['name']} is configured already ({item['role']})"
    if main or not _has_main(cfg):
        return {"model": {"path": str(model.path)}}, f"{model.name} is now the main model (model.path)"
    entries = [asdict(entry) for entry in cfg.models]
    entries.append(asdict(config.LibraryModelConfig(name=name, path=str(model.path))))
    changed = config.from_dict({**cfg.to_dict(), "models": entries}, source=cfg.source)
    catalog_from_config(changed)  # a name used twice is a ConfigError naming it, before anything is written
    return {"models": entries}, f"{name} is in the library: a request for the model {name!r} loads it"
