"""The config as the control API shows it."""

from __future__ import annotations

from typing import Any

from tray_app.config import notify
from tray_app.config.schema import Config


def public_view(config: Config) -> dict[str, Any]:
    """The config as the control API shows it: API keys (its own, its peers') are not repeated, only
    whether one is set."""
    data = config.to_dict()
    data["server"]["api_key"] = "(set)" if config.server.api_key else ""
    for peer in data["peers"]:
        peer["api_key"] = "(set)" if peer["api_key"] else ""
    data["notify"] = notify.redacted(config.notify)
    return data
