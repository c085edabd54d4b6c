"""`failsoft models` (the configured models and the GGUF files other programs put on this machine) and
`failsoft models add NAME` (one of them into the config, by path: nothing is copied).

`add` makes the model the main one when there is none yet (no model.path and no bundled model), or with
--main; otherwise it becomes a `[[models]]` entry, loaded when a request names it. Either way it goes by the
name `failsoft models` lists (or --as): for the main model that name is model.name when its file does not
give it, as an Ollama blob (`sha256-…`) does not.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tray_app import config, paths
from tray_app.contract.sizes import format_size
from tray_app.library.catalog import catalog_from_config
from tray_app.library.discovery import SOURCES, FoundModel, discover, is_gguf


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
        main = cfg.model.name or Path(cfg.model.path).name
        listed.insert(0, {"name": main, "path": cfg.model.path, "role": "main"})
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
        written, said = _add_to(cfg, model, args.alias, args.main)
    except (AddError, config.ConfigError) as error:
        print(f"failsoft models add: {error}", file=sys.stderr)
        return 1
    if written:
        config.edit_file(target, written)
    print(f"{said} in {target} (the file stays where it is: {model.path})")
    print("a running service takes it at its next start")
    return 0


def _add_to(
    cfg: config.Config, model: FoundModel, alias: str | None, main: bool
) -> tuple[dict[str, Any], str]:
    """The config change that adds `model` (nothing when it is configured already) and what to say."""
    resolved = model.path.resolve()
    same = [item for item in configured(cfg) if Path(item["path"]).expanduser().resolve() == resolved]
    if same and same[0]["role"] == "main":
        return _rename_main(cfg, model, alias, same[0]["name"])
    if same and not main:
        return {}, f"{same[0]['name']} is configured already ({same[0]['role']})"
    if main or not _has_main(cfg):
        # A library model made the main one keeps the name requests know it by.
        return _make_main(cfg, model, alias or (same[0]["name"] if same else model.name))
    name = alias or model.name
    entries = [asdict(entry) for entry in cfg.models]
    entries.append(asdict(config.LibraryModelConfig(name=name, path=str(model.path))))
    _check(cfg, {"models": entries})
    return {"models": entries}, f"{name} is in the library: a request for the model {name!r} loads it"


def _own_name(model: FoundModel, name: str) -> str:
    """model.name for the main model called `name`: "" when its file goes by that name already (a GGUF's
    stem), so only a name the file does not give is written (an Ollama blob's is its digest)."""
    return "" if name in (model.path.name, model.path.stem) else name


def _make_main(cfg: config.Config, model: FoundModel, name: str) -> tuple[dict[str, Any], str]:
    change: dict[str, Any] = {"model": {"path": str(model.path), "name": _own_name(model, name)}}
    resolved = model.path.resolve()
    others = [asdict(entry) for entry in cfg.models if Path(entry.path).expanduser().resolve() != resolved]
    if len(others) < len(cfg.models):
        change["models"] = others  # else the file would have two names and two sets of workers
    _check(cfg, change)
    moved = ", no longer in the library" if "models" in change else ""
    return change, f"{name} is now the main model (model.path){moved}"


def _rename_main(
    cfg: config.Config, model: FoundModel, alias: str | None, current: str
) -> tuple[dict[str, Any], str]:
    """The main model added again: it takes the name found or given (a config written before model.name
    existed calls an Ollama model by its blob); a name it has is not traded for its file's."""
    name = _own_name(model, alias or model.name)
    if not name or name == cfg.model.name:
        return {}, f"{current} is configured already (main)"
    change = {"model": {"name": name}}
    _check(cfg, change)
    return change, f"the main model ({current}) is now called {name}"


def _check(cfg: config.Config, change: dict[str, Any]) -> None:
    """A ConfigError naming what is wrong (a name used twice, one llama-server cannot take) when the config
    with `change` could not be served, before anything is written."""
    data = cfg.to_dict()
    for section, values in change.items():
        data[section] = {**data[section], **values} if isinstance(values, dict) else values
    catalog_from_config(config.from_dict(data, source=cfg.source))
