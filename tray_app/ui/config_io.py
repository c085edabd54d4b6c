"""Which changed settings wait for a restart, in the terms the settings window shows them."""

from __future__ import annotations

from tray_app import config


def needs_restart(keys: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The changed keys a running service takes over only after a restart (config.is_live)."""
    return [key for key in keys if not config.is_live(*key)]
