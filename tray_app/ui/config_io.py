"""Read, change and write the config file the way the settings and approvals windows need it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tray_app import config


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (section, key)
        for section, values in new.items()
        for key, value in values.items()
        if (old.get(section) or {}).get(key) != value
    ]


def apply_changes(
    path: Path, changes: dict[str, dict[str, Any]]
) -> tuple[config.Config, list[tuple[str, str]]]:
    """Validate the file's config with `changes` applied, write it, and return it with the keys that changed.

    Raises ConfigError (nothing written) when a value is not allowed.
    """
    current = config.load(path)
    data = current.to_dict()
    merged = {section: dict(values) for section, values in data.items()}
    for section, values in changes.items():
        merged.setdefault(section, {}).update(values)
    updated = config.from_dict(merged, source=str(path))
    changed = changed_keys(data, updated.to_dict())
    if changed:
        config.save(updated, path)
    return updated, changed


def needs_restart(keys: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The changed keys a running service takes over only after a restart (config.is_live)."""
    return [key for key in keys if not config.is_live(*key)]
