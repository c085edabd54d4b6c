"""`failsoft install --user` and `failsoft uninstall --user` (a checkout's `make install` and `make
uninstall`): this Failsoft where the desktop and systemd find it, for this user only (nothing outside the home
directory, no root).

install puts
- `~/.local/bin/failsoft`: a link to the venv's command (the venv stays where it is);
- the menu entry and its icon (the XDG data dir): the tray is one click away;
- the systemd user unit (`~/.config/systemd/user/failsoft.service`), not enabled:
  `systemctl --user enable --now failsoft` starts the service now and at every boot;
- with `--autostart`, the menu entry in `~/.config/autostart`: the tray at login. With the unit enabled too,
  that tray shows the unit's service.

uninstall removes what install put there, and only that: a file at one of those places that install did
not write is left alone. Python's standard library only: packaging/install_user.py runs it from a checkout.
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
import shutil
import subprocess
import sys
from pathlib import Path

MARK = "X-Failsoft-Installed-By=make install"  # in the desktop entries and, as a comment, in the unit
UNIT = "failsoft.service"


def resource(*parts: str) -> Path:
    """A file the package carries (the menu entry, the unit, the icon); found as tray_app.paths finds them,
    without importing that module's dependencies."""
    return Path(str(importlib.resources.files("tray_app").joinpath("resources", *parts)))


def home_dir(name: str, default: str) -> Path:
    value = os.environ.get(name, "")
    return Path(value) if value else Path.home() / default


def places() -> dict[str, Path]:
    data, config = home_dir("XDG_DATA_HOME", ".local/share"), home_dir("XDG_CONFIG_HOME", ".config")
    return {
        "command": Path.home() / ".local" / "bin" / "failsoft",
        "menu": data / "applications" / "failsoft.desktop",
        "icon": data / "icons" / "hicolor" / "scalable" / "apps" / "failsoft.svg",
        "unit": config / "systemd" / "user" / UNIT,
        "autostart": config / "autostart" / "failsoft.desktop",
    }


def desktop_entry(command: Path) -> str:
    """The packaged entry, run by its full path (a desktop's PATH often lacks ~/.local/bin at login)."""
    lines = resource("desktop", "failsoft.desktop").read_text(encoding="utf-8").splitlines()
    lines = [f"Exec={command}" if line.startswith("Exec=") else line for line in lines]
    return "\n".join([*lines, MARK]) + "\n"


def unit_file() -> str:
    return resource("systemd", UNIT).read_text(encoding="utf-8") + f"# {MARK}\n"


def user_systemd() -> bool:
    """A user systemd to talk to (not in a container, nor over plain ssh without a session)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    return bool(shutil.which("systemctl") and runtime and (Path(runtime) / "systemd" / "private").exists())


def systemctl(*args: str) -> None:
    subprocess.run(["systemctl", "--user", *args], check=False)


def install(venv: Path, autostart: bool) -> int:
    target = (venv / "bin" / "failsoft").resolve()
    if not os.access(target, os.X_OK):
        print(f"install: {target} is missing: in a checkout, run `make run` first", file=sys.stderr)
        return 1
    where = places()
    if not autostart:
        del where["autostart"]
    command = where["command"]
    foreign = [path for name, path in where.items() if path.exists() and not mine(name, path, target)]
    if foreign:
        for path in foreign:
            print(f"install: {path} exists and is not Failsoft's; nothing changed", file=sys.stderr)
        return 1
    command.parent.mkdir(parents=True, exist_ok=True)
    command.unlink(missing_ok=True)
    command.symlink_to(target)
    for name in ("menu", "autostart"):
        if name in where:
            write(where[name], desktop_entry(command))
    where["icon"].parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(resource("icons", "failsoft.svg"), where["icon"])
    write(where["unit"], unit_file())
    for path in where.values():
        print(f"installed {path}")
    if user_systemd():
        systemctl("daemon-reload")
    print("the service now and at every boot:  systemctl --user enable --now failsoft")
    if str(command.parent) not in os.environ.get("PATH", "").split(os.pathsep):
        print(f"{command.parent} is not on PATH: add it, or run {command}")
    return 0


def uninstall(venv: Path) -> int:
    target = (venv / "bin" / "failsoft").resolve()
    where = places()
    owned = [path for name, path in where.items() if path.exists() and mine(name, path, target)]
    if where["unit"] in owned and user_systemd():
        systemctl("disable", "--now", UNIT)
    for path in owned:
        path.unlink()
        print(f"removed {path}")
    if where["unit"] in owned and user_systemd():
        systemctl("daemon-reload")
    return 0


def mine(name: str, path: Path, target: Path) -> bool:
    """Whether install put the file at `path` (the command: a link to this venv's)."""
    if name == "command":
        return path.is_symlink() and path.resolve() == target
    if name == "icon":
        return path.read_bytes() == resource("icons", "failsoft.svg").read_bytes()
    try:
        return MARK in path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None, default_venv: Path | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("action", choices=["install", "uninstall"])
    parser.add_argument("--venv", type=Path, default=default_venv, required=default_venv is None)
    parser.add_argument("--autostart", action="store_true", help="start the tray at login")
    args = parser.parse_args(argv)
    if args.action == "install":
        return install(args.venv, args.autostart)
    return uninstall(args.venv)


if __name__ == "__main__":
    sys.exit(main())
