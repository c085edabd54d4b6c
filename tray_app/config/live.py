"""The live-change policy: what a running service takes over without a restart; what only the file sets."""

from __future__ import annotations

import copy
from typing import Any

from tray_app.config.schema import Config

# What a running service takes over without restarting a worker (POST /failsoft/config/reload); every other
# key changes what the workers were started with, or the listening socket.
LIVE_SECTIONS = ("failover", "journal", "gpu")
LIVE_SERVER_KEYS = (
    "queue_max",
    "queue_timeout",
    "jobs_max",
    "max_body",
    "keepalive_seconds",
    "public_url",
    "allowed_hosts",
    "allowed_origins",
)


LIVE_LIBRARY_KEYS = ("keep_alive", "stand_in")  # read at each request; a new folder or max waits
LIVE_EMBEDDINGS_KEYS = ("max_request_tokens",)  # read at each request
LIVE_CPU_KEYS = ("mirror", "mirror_slots", "mirror_min_ms", "mirror_every_tokens", "mirror_every_seconds")
# What only the user writes, in the file: programs, model and template files the service would run or read,
# and what exposes the service or locks it. `PATCH /failsoft/config` refuses them ("*": the whole section).
FILE_ONLY = frozenset(
    {
        ("engine", "*"),
        ("models", "*"),
        ("model", "path"),
        ("model", "name"),  # set with the file it names
        ("model", "chat_format"),
        ("library", "folder"),
        ("embeddings", "model"),
        ("server", "host"),
        ("server", "api_key"),
        ("server", "public_url"),  # its host is let through the Host check (server/origin_guard.py)
        ("notify", "*"),  # where the service sends what it knows, and its tokens
        ("peers", "*"),  # where the service sends prompts, and the keys it sends with them
    }
)


def file_only(changes: dict[str, Any]) -> list[str]:
    """The `section.key` names in `changes` that only the config file may set (FILE_ONLY)."""
    names = []
    for section, values in changes.items():
        if (section, "*") in FILE_ONLY:
            names.append(section if section in ("models", "peers") else f"{section}.*")
        elif isinstance(values, dict):
            names += [f"{section}.{key}" for key in values if (section, key) in FILE_ONLY]
    return names


def is_live(section: str, key: str) -> bool:
    return (
        section in LIVE_SECTIONS
        or (section == "server" and key in LIVE_SERVER_KEYS)
        or (section == "library" and key in LIVE_LIBRARY_KEYS)
        or (section == "embeddings" and key in LIVE_EMBEDDINGS_KEYS)
        or (section == "cpu" and key in LIVE_CPU_KEYS)
    )


def with_live_changes(current: Config, fresh: Config) -> tuple[Config, list[str], list[str]]:
    """A new snapshot: `current` with `fresh`'s live values (current itself is left as it is, for whoever
    still reads it), the `section.key` names taken over, and those that need a restart."""
    merged = copy.deepcopy(current)
    applied: list[str] = []
    needs_restart: list[str] = []
    old, new = current.to_dict(), fresh.to_dict()
    for section, values in new.items():
        if not isinstance(values, dict):  # [[models]]: the library's workers follow it at a restart
            if old[section] != values and section == "notify":  # read at each message: live
                merged.notify = copy.deepcopy(fresh.notify)
                applied.append(section)
            elif old[section] != values:
                needs_restart.append(section)
            continue
        for key, value in values.items():
            if old[section][key] == value:
                continue
            if is_live(section, key):
                setattr(getattr(merged, section), key, copy.deepcopy(value))
                applied.append(f"{section}.{key}")
            else:
                needs_restart.append(f"{section}.{key}")
    return merged, applied, needs_restart


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, str]]:
    changed = []
    for section, values in new.items():
        if not isinstance(values, dict):  # [[models]]: one list
            if old.get(section) != values:
                changed.append((section, "*"))
            continue
        changed += [
            (section, key) for key, value in values.items() if (old.get(section) or {}).get(key) != value
        ]
    return changed
