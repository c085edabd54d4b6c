"""`failsoft install --system`: Failsoft as a system service of its own user, as home-server software runs.

It writes
- `/etc/sysusers.d/failsoft.conf`: the user `failsoft` (no login, home /var/lib/failsoft) in the GPU device
  groups this machine has (video, render), made at once with systemd-sysusers;
- `/etc/failsoft/config.toml` (root:failsoft 0640), when there is none: a copy of the config that ran the
  command. The service only reads it (edit it, then `systemctl restart failsoft`);
- `/etc/systemd/system/failsoft.service`: `Type=notify` (the service reports ready and pings the watchdog),
  its data, logs, cache and runtime folders made by systemd, and hardened: `NoNewPrivileges`,
  `ProtectSystem=strict` (those folders the only writable ones), `PrivateTmp`, `ProtectHome=yes`, or
  `read-only` when the command, the engine or a configured model lies under a home folder. No
  `PrivateDevices` nor `ProtectClock` (its device allow-list): the GPU's device nodes must stay reachable.

The admin credential is copied at each start to /run/failsoft/admin-token, readable by the group `failsoft`:
a member attaches the tray with it. `--root DIR` writes the same files under DIR and runs nothing (a package
build, the tests). `failsoft uninstall --system` removes what install wrote, and names what it leaves.
"""

from __future__ import annotations

import grp
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from tray_app import config, paths
from tray_app.reach import admin_token

USER = "failsoft"
GPU_GROUPS = ("video", "render")
MARK = "X-Failsoft-Installed-By=failsoft install --system"
CONFIG = Path("/etc/failsoft/config.toml")
DATA, LOGS, CACHE, RUN = (Path(f"/{base}/failsoft") for base in ("var/lib", "var/log", "var/cache", "run"))
ADMIN_TOKEN_COPY = admin_token.SYSTEM_COPY  # in RUN: the clients of a member of the group read it there
HOME_ROOTS = (Path("/home"), Path("/root"), Path("/run/user"))


class InstallError(RuntimeError):
    """The system install cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class Layout:
    """Where the files go: under `root` ("/" for a real install, a staging folder otherwise)."""

    root: Path

    def place(self, path: Path) -> Path:
        return self.root / path.relative_to("/")

    @property
    def unit(self) -> Path:
        return self.place(Path("/etc/systemd/system/failsoft.service"))

    @property
    def sysusers(self) -> Path:
        return self.place(Path("/etc/sysusers.d/failsoft.conf"))

    @property
    def config(self) -> Path:
        return self.place(CONFIG)

    @property
    def config_stamp(self) -> Path:
        """The sha256 of the config install wrote: uninstall removes the file only while it is unchanged."""
        return self.config.with_name(".installed-config-sha256")

    @property
    def real(self) -> bool:
        return self.root == Path("/")


Action = Callable[[Layout], list[str]]  # install or uninstall: what to say


def gpu_groups() -> list[str]:
    """The device groups that exist here: a unit naming a missing group does not start."""
    present = []
    for name in GPU_GROUPS:
        try:
            grp.getgrnam(name)
        except KeyError:
            continue
        present.append(name)
    return present


def under_a_home(path: Path) -> bool:
    resolved = path.expanduser().resolve()
    return any(resolved.is_relative_to(root) for root in HOME_ROOTS)


def service_reads(cfg: config.Config, command: Path) -> list[Path]:
    """What the service must read besides the system: its command and environment, the engine, the models."""
    needed = [command, Path(sys.prefix)]
    for value in (cfg.engine.llama_server, cfg.model.path, cfg.library.folder, cfg.embeddings.model):
        if value:
            needed.append(Path(value).expanduser())
    needed += [Path(model.path).expanduser() for model in cfg.models]
    return needed


# What the service finds in its environment: its own folders, not the installing user's.
SERVICE_ENVIRONMENT = {
    "FAILSOFT_CONFIG": CONFIG,
    "FAILSOFT_DATA_DIR": DATA,
    "FAILSOFT_LOG_DIR": LOGS,
    "FAILSOFT_RUNTIME_DIR": RUN / "service",  # its own 0700 folder; RUN itself is shared with the group
    "HOME": DATA,
    "XDG_CACHE_HOME": CACHE,
}
# The unit; {supplementary_groups} is a whole line or nothing. ExecStartPost copies the admin token for the
# members of the group (the service writes it at start, before it is ready); its "-": a missing copy must
# not stop the service.
UNIT_TEMPLATE = """\
# systemd system unit: Failsoft as a service of its own user (from failsoft install --system).
#   start:   systemctl enable --now failsoft
#   logs:    journalctl -u failsoft   (worker logs: {logs})
#   config:  {config} (the service only reads it: edit it, then systemctl restart failsoft)
#   tray:    usermod -aG {user} YOU; then as YOU: failsoft   (it attaches with {admin_token_copy})
# {mark}
[Unit]
Description=Failsoft: llama.cpp GPU worker with safe CPU failover
Wants=network-online.target
After=network-online.target

[Service]
Type=notify
NotifyAccess=main
User={user}
Group={user}
{supplementary_groups}ExecStart={command} serve
ExecStartPost=-/usr/bin/install -m 0640 {admin_token} {admin_token_copy}
{environment}
StateDirectory=failsoft
LogsDirectory=failsoft
CacheDirectory=failsoft
RuntimeDirectory=failsoft
RuntimeDirectoryMode=0750
WatchdogSec=60
Restart=on-failure
RestartSec=5
# Workers run in the service's cgroup and process group; stopping the unit stops them too.
KillMode=mixed
TimeoutStopSec=30
# Hardening. No PrivateDevices, DevicePolicy nor ProtectClock: each closes the GPU's device nodes.
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome={protect_home}
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
RestrictNamespaces=yes
LockPersonality=yes
SystemCallArchitectures=native
CapabilityBoundingSet=
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
UMask=0077

[Install]
WantedBy=multi-user.target
"""


def unit_text(command: Path, groups: list[str], protect_home: str) -> str:
    return UNIT_TEMPLATE.format(
        command=command,
        supplementary_groups=f"SupplementaryGroups={' '.join(groups)}\n" if groups else "",
        protect_home=protect_home,
        environment="\n".join(f"Environment={name}={value}" for name, value in SERVICE_ENVIRONMENT.items()),
        user=USER,
        logs=LOGS,
        config=CONFIG,
        mark=MARK,
        admin_token=DATA / "admin-token",
        admin_token_copy=ADMIN_TOKEN_COPY,
    )


def sysusers_text(groups: list[str]) -> str:
    lines = [f"# {MARK}", f'u {USER} - "Failsoft service" {DATA} /usr/sbin/nologin']
    lines += [f"m {USER} {group}" for group in groups]
    return "\n".join(lines) + "\n"


def not_readable_by_others(path: Path) -> bool:
    """Whether a user other than the owner (the service's) may be kept out: a folder on the way without
    o+x, or the file itself without o+r. A hint only: groups and ACLs may still let it through."""
    try:
        resolved = path.expanduser().resolve()
        if not (resolved.stat().st_mode & 0o004 or resolved.is_dir()):
            return True
        return any(not parent.stat().st_mode & 0o001 for parent in resolved.parents)
    except OSError:
        return True


def install(layout: Layout, command: Path, cfg: config.Config) -> list[str]:
    """Write the files (and, for a real install, make the user and reload systemd); what to say."""
    if layout.real and os.geteuid() != 0:
        raise InstallError(f"a system service needs root: sudo {command} install --system")
    if not command.is_file():
        raise InstallError(
            f"{command} is not there: run this with the failsoft command the service should run"
        )
    groups = gpu_groups()
    reads = service_reads(cfg, command)
    protect_home = "read-only" if any(under_a_home(path) for path in reads) else "yes"
    said = []
    _write(layout.sysusers, sysusers_text(groups), 0o644)
    if layout.real:
        _run(["systemd-sysusers", str(layout.sysusers)])
    if not layout.config.exists():
        data = tomli_w.dumps(cfg.to_dict()).encode()
        _write(layout.config, data.decode(), 0o640)
        layout.config_stamp.write_text(hashlib.sha256(data).hexdigest() + "\n", encoding="ascii")
        if layout.real:
            shutil.chown(layout.config, "root", USER)
        source = Path(cfg.source or paths.config_file())
        said.append(f"wrote {layout.config} from {source}{'' if source.exists() else ' (defaults: no file)'}")
    else:
        said.append(f"kept {layout.config} as it is")
    _write(layout.unit, unit_text(command, groups, protect_home), 0o644)
    said += [
        f"wrote {layout.sysusers} (user {USER}, groups: {', '.join(groups) or 'none'})",
        f"wrote {layout.unit}",
    ]
    for path in reads:
        if under_a_home(path) and not_readable_by_others(path):
            said.append(f"warning: the user {USER} may not be able to read {path} (under a home folder)")
    if layout.real and _systemd_runs():
        _run(["systemctl", "daemon-reload"])
    said.append("start it now and at every boot: systemctl enable --now failsoft")
    return said


def uninstall(layout: Layout) -> list[str]:
    """Remove what install wrote (a file changed since, or not ours, stays); what to say."""
    if layout.real and os.geteuid() != 0:
        raise InstallError("removing a system service needs root: sudo failsoft uninstall --system")
    said = []
    if layout.real and _systemd_runs() and _ours(layout.unit):
        subprocess.run(["systemctl", "disable", "--now", "failsoft.service"], check=False)
    for path in (layout.unit, layout.sysusers):
        if _ours(path):
            path.unlink()
            said.append(f"removed {path}")
        elif path.exists():
            said.append(f"left {path}: not written by failsoft install --system")
    said += _remove_config(layout)
    if layout.real and _systemd_runs():
        _run(["systemctl", "daemon-reload"])
    said.append(f"left the user {USER} and its data ({DATA}, {LOGS}, {CACHE}): userdel {USER}; rm -r them")
    return said


def _remove_config(layout: Layout) -> list[str]:
    if not layout.config.exists():
        return []
    try:
        written = layout.config_stamp.read_text(encoding="ascii").strip()
    except OSError:
        written = ""
    if hashlib.sha256(layout.config.read_bytes()).hexdigest() != written:
        return [f"left {layout.config}: changed since install wrote it"]
    layout.config.unlink()
    layout.config_stamp.unlink()
    if not any(layout.config.parent.iterdir()):
        layout.config.parent.rmdir()
    return [f"removed {layout.config}"]


def _ours(path: Path) -> bool:
    try:
        return MARK in path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False


def _write(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)


def _systemd_runs() -> bool:
    return Path("/run/systemd/system").is_dir() and shutil.which("systemctl") is not None


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise InstallError(f"{' '.join(command)} failed: {(done.stderr or done.stdout).strip()}")
