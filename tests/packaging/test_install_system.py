"""`failsoft install --system` and `failsoft uninstall --system`, written under a staging root (`--root`):
the unit, the service user and the config, checked with systemd's own tools where they are installed."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tray_app import cli
from tray_app.install import system


def install(root: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["install", "--system", "--root", str(root)]) == 0
    return capsys.readouterr().out


def unit_lines(root: Path) -> list[str]:
    return (root / "etc/systemd/system/failsoft.service").read_text(encoding="utf-8").splitlines()


def test_a_hardened_notify_unit_for_a_user_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    said = install(tmp_path / "root", capsys)
    lines = unit_lines(tmp_path / "root")
    for line in (
        "Type=notify",
        "User=failsoft",
        f"ExecStart={Path(sys.prefix) / 'bin' / 'failsoft'} serve",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",  # the command, its environment and the bundled model are outside any home here
        "PrivateTmp=yes",
        "StateDirectory=failsoft",
        "Environment=FAILSOFT_CONFIG=/etc/failsoft/config.toml",
    ):
        assert line in lines, line
    groups = system.gpu_groups()
    assert ("SupplementaryGroups=" + " ".join(groups) in lines) == bool(groups)
    assert not any(line.startswith(("PrivateDevices", "DevicePolicy", "ProtectClock")) for line in lines)
    sysusers = (tmp_path / "root/etc/sysusers.d/failsoft.conf").read_text(encoding="utf-8").splitlines()
    assert 'u failsoft - "Failsoft service" /var/lib/failsoft /usr/sbin/nologin' in sysusers
    assert [line for line in sysusers if line.startswith("m ")] == [f"m failsoft {g}" for g in groups]
    config = tmp_path / "root/etc/failsoft/config.toml"
    assert config.stat().st_mode & 0o777 == 0o640 and "[model]" in config.read_text(encoding="utf-8")
    assert "systemctl enable --now failsoft" in said


def test_systemd_analyze_verifies_the_unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here (Debian: apt-get install systemd)")
    install(tmp_path / "root", capsys)
    unit = tmp_path / "root/etc/systemd/system/failsoft.service"
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    sysusers = tmp_path / "root/etc/sysusers.d/failsoft.conf"
    if shutil.which("systemd-sysusers"):
        dry = subprocess.run(
            ["systemd-sysusers", "--dry-run", f"--root={tmp_path / 'root'}", str(sysusers)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert dry.returncode == 0, dry.stderr
        assert "Creating user 'failsoft'" in dry.stdout + dry.stderr


def test_a_model_under_a_home_folder_makes_home_read_only_and_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Path(os.environ["FAILSOFT_CONFIG"]).write_text(
        '[[models]]\nname = "mine"\npath = "/home/someone/models/mine.gguf"\n', encoding="utf-8"
    )
    said = install(tmp_path / "root", capsys)
    assert "ProtectHome=read-only" in unit_lines(tmp_path / "root")
    assert "may not be able to read /home/someone/models/mine.gguf" in said


def test_uninstall_removes_what_install_wrote_and_keeps_a_changed_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    install(root, capsys)
    assert cli.main(["uninstall", "--system", "--root", str(root)]) == 0
    said = capsys.readouterr().out
    assert not (root / "etc/systemd/system/failsoft.service").exists()
    assert not (root / "etc/sysusers.d/failsoft.conf").exists() and not (root / "etc/failsoft").exists()
    assert "left the user failsoft and its data" in said

    install(root, capsys)
    config = root / "etc/failsoft/config.toml"
    config.write_text(config.read_text(encoding="utf-8") + "\n# mine\n", encoding="utf-8")
    install(root, capsys)  # a second install keeps the config the admin edited
    assert config.read_text(encoding="utf-8").endswith("# mine\n")
    assert cli.main(["uninstall", "--system", "--root", str(root)]) == 0
    assert f"left {config}: changed since install wrote it" in capsys.readouterr().out
    assert config.exists() and not (root / "etc/systemd/system/failsoft.service").exists()


def test_install_user_writes_the_autostart_entry_for_the_tray(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env.update(HOME=str(home), PATH="/usr/bin:/bin")
    command = [str(Path(sys.prefix) / "bin" / "failsoft")]
    done = subprocess.run(
        [*command, "install", "--user", "--autostart"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    autostart = home / ".config" / "autostart" / "failsoft.desktop"
    entry = configparser.ConfigParser(interpolation=None)
    entry.read(autostart, encoding="utf-8")
    assert entry["Desktop Entry"]["Exec"] == str(home / ".local" / "bin" / "failsoft")
    assert (home / ".config" / "systemd" / "user" / "failsoft.service").exists()
    done = subprocess.run(
        [*command, "uninstall", "--user"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and not autostart.exists(), done.stderr
