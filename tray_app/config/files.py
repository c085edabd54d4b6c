"""The config file: read (`load`), written whole and private (`save`, `write_private`), edited in place
(`edit_file`)."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from tray_app import paths
from tray_app.config.live import changed_keys
from tray_app.config.schema import Config, ConfigError
from tray_app.config.validation import _forget_name_of_another_file, from_dict


def load(path: Path | None = None) -> Config:
    """The config at `path` (default: the user config file); defaults when that file does not exist."""
    path = path or paths.config_file()
    if not path.exists():
        return Config(source=str(path))
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    config = from_dict(data, source=str(path))
    if config.server.api_key or any(peer.api_key for peer in config.peers):
        _make_private(path)
    return config


def _make_private(path: Path) -> None:
    """A config holding an API key (its own, a peer's) that others can read is narrowed to 0600 (best
    effort)."""
    try:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077 and path.stat().st_uid == os.getuid():
            os.chmod(path, mode & 0o700)
            logging.getLogger(__name__).warning(
                "%s holds an API key and was readable by others (%o): now %o", path, mode, mode & 0o700
            )
    except OSError:
        pass


def save(config: Config, path: Path | None = None) -> Path:
    """Write the config as TOML (validated first, so a bad value never reaches the file)."""
    path = path or (Path(config.source) if config.source else paths.config_file())
    from_dict(config.to_dict(), source=str(path))
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(path, tomli_w.dumps(config.to_dict()).encode())
    return path


def write_private(path: Path, data: bytes) -> None:
    """Replace `path` with `data`, readable by the owner only (0600): the config may hold the API key.

    Written to a temporary file in the same folder and renamed over, so no reader sees half a file and the
    mode is 0600 before any byte is written."""
    path = path.resolve()  # a symlinked config stays a symlink: its target is replaced
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # created 0600
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def edit_file(path: Path, changes: dict[str, dict[str, Any]]) -> tuple[Config, list[tuple[str, str]]]:
    """Validate the file's config with `changes` applied, write it (0600) when something changed, and
    return it with the keys that changed. ConfigError (nothing written) when a value is not allowed."""
    current = load(path)
    data = current.to_dict()
    merged: dict[str, Any] = {
        section: dict(values) if isinstance(values, dict) else values for section, values in data.items()
    }
    for section, values in changes.items():
        if section == "models":
            merged["models"] = values  # the whole list, checked as the file's would be
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: [{section}] must be a table of keys")
        merged.setdefault(section, {}).update(values)
    _forget_name_of_another_file(data, merged, named="name" in (changes.get("model") or {}))
    updated = from_dict(merged, source=str(path))
    changed = changed_keys(data, updated.to_dict())
    if changed:
        save(updated, path)
    return updated, changed
