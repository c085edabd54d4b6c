"""`make install` / `make uninstall` in a throwaway home: the command on PATH, the menu entry, its icon, the
systemd user unit and the tray at login, each pointing at this checkout's venv; and removed again, leaving
what was not Failsoft's alone."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent


def make(target: str, home: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """What `make install|uninstall` runs (AUTOSTART=1 adds --autostart), in a throwaway home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env.update(HOME=str(home), XDG_RUNTIME_DIR=str(home / "run"), PATH="/usr/bin:/bin")
    script = REPO / "packaging" / "install_user.py"
    autostart = ["--autostart"] if extra.get("AUTOSTART") else []
    return subprocess.run(
        [sys.executable, str(script), target, "--venv", str(VENV), *autostart],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def entry(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path, encoding="utf-8")
    return parser["Desktop Entry"]


def test_install_puts_failsoft_where_the_desktop_and_systemd_find_it_and_uninstall_takes_it_back(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    (home / "run").mkdir(parents=True)
    done = make("install", home, AUTOSTART="1")
    assert done.returncode == 0, done.stdout + done.stderr

    command = home / ".local" / "bin" / "failsoft"
    assert command.is_symlink() and command.resolve() == (VENV / "bin" / "failsoft").resolve()
    version = subprocess.run([str(command), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("failsoft "), version

    menu = home / ".local" / "share" / "applications" / "failsoft.desktop"
    autostart = home / ".config" / "autostart" / "failsoft.desktop"
    for desktop_file in (menu, autostart):
        fields = entry(desktop_file)
        assert fields["Exec"] == str(command) and fields["Icon"] == "failsoft"
    icon = home / ".local" / "share" / "icons" / "hicolor" / "scalable" / "apps" / "failsoft.svg"
    assert icon.read_bytes() == (REPO / "resources" / "icons" / "failsoft.svg").read_bytes()
    unit = (home / ".config" / "systemd" / "user" / "failsoft.service").read_text(encoding="utf-8")
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_start.replace("%h", str(home)) == f"ExecStart={command} serve"
    assert "systemctl --user enable --now failsoft" in done.stdout
    assert f"{command.parent} is not on PATH" in done.stdout

    again = make("install", home)  # a second install replaces its own files without complaint
    assert again.returncode == 0, again.stderr

    done = make("uninstall", home)
    assert done.returncode == 0, done.stderr
    for path in (command, menu, autostart, icon, home / ".config" / "systemd" / "user" / "failsoft.service"):
        assert not path.exists() and not path.is_symlink(), path


def test_install_changes_nothing_where_a_file_is_not_failsofts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "run").mkdir(parents=True)
    own = home / ".local" / "share" / "applications" / "failsoft.desktop"
    own.parent.mkdir(parents=True)
    own.write_text("[Desktop Entry]\nName=my own launcher\nExec=/opt/failsoft/run\n", encoding="utf-8")

    done = make("install", home)
    assert done.returncode == 1
    assert f"{own} exists and is not Failsoft's; nothing changed" in done.stderr
    assert not (home / ".local" / "bin" / "failsoft").exists()
    assert make("uninstall", home).returncode == 0
    assert own.read_text(encoding="utf-8").startswith("[Desktop Entry]\nName=my own launcher")
