"""The config as a command sees it: the file with the command line's overrides (`load_config`), and
`failsoft config`, which prints it."""

from __future__ import annotations

import argparse
import json

from tray_app.config.files import load
from tray_app.config.schema import Config
from tray_app.config.validation import apply_overrides


def load_config(args: argparse.Namespace) -> Config:
    """The config file with the command line's overrides applied (overrides are validated the same way)."""
    overrides: dict[str, object] = {}
    if getattr(args, "model", None):
        overrides["model.path"] = str(args.model)
    if getattr(args, "simulate_vram", None):
        overrides["device.simulate_vram"] = args.simulate_vram
    if getattr(args, "host", None):
        overrides["server.host"] = args.host
    if getattr(args, "port", None):
        overrides["server.port"] = args.port
    return apply_overrides(load(args.config), overrides)


def show_config(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    if args.json:
        print(json.dumps({"source": cfg.source, **cfg.to_dict()}, indent=2))
    else:
        import tomli_w

        print(f"# effective config; file: {cfg.source}")
        print(tomli_w.dumps(cfg.to_dict()), end="")
    return 0
