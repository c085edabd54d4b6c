"""`failsoft install` and `failsoft uninstall`: `--user` (the menu entry, the systemd user unit, with
`--autostart` the tray at login) or `--system` (a system service of its own user; see install/system.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tray_app import config
from tray_app.install import system, user


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, summary in (
        ("install", "put Failsoft where the desktop and systemd find it: for you, or as a system service"),
        ("uninstall", "remove what `failsoft install` wrote (and only that)"),
    ):
        parser = sub.add_parser(name, help=summary)
        scope = parser.add_mutually_exclusive_group(required=True)
        scope.add_argument("--user", action="store_true", help="for you: menu entry, systemd user unit")
        scope.add_argument("--system", action="store_true", help="a system service of its own user (root)")
        parser.add_argument(
            "--root", type=Path, metavar="DIR", help="with --system: write under DIR, run nothing (packaging)"
        )
        if name == "install":
            parser.add_argument("--autostart", action="store_true", help="with --user: the tray at login")


def _command() -> Path:
    """The failsoft command of this environment (pipx's, a venv's): what the units run."""
    return Path(sys.prefix) / "bin" / "failsoft"


def install(args: argparse.Namespace) -> int:
    if args.user:
        return user.install(Path(sys.prefix), args.autostart)
    return _system(args, lambda layout: system.install(layout, _command(), config.load()))


def uninstall(args: argparse.Namespace) -> int:
    if args.user:
        return user.uninstall(Path(sys.prefix))
    return _system(args, system.uninstall)


def _system(args: argparse.Namespace, action: system.Action) -> int:
    layout = system.Layout(args.root.resolve() if args.root else Path("/"))
    try:
        said = action(layout)
    except system.InstallError as error:
        print(f"failsoft {args.command}: {error}", file=sys.stderr)
        return 1
    print("\n".join(said))
    return 0
