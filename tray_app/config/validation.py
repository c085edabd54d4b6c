"""Validation: every value checked against its section's type, then the relations between them; every error
names the file, the key and what is allowed."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import fields
from typing import Any, Literal, get_args, get_type_hints

from tray_app.config import notify, peers
from tray_app.config.origins import normalize_origin
from tray_app.config.schema import Config, ConfigError, LibraryModelConfig
from tray_app.contract.sizes import parse_size

_SIZE_KEYS = {
    ("budget", "reserve_min"),
    ("cpu", "reserve_min"),
    ("server", "max_body"),
    ("device", "simulate_vram"),
}
_REQUIRED_SIZES = {("server", "max_body")}  # the others' empty value means "none" or "the default"
_NON_NEGATIVE = (int, float)


def _check_value(where: str, key: str, expected: Any, value: Any) -> Any:
    choices = get_args(expected) if getattr(expected, "__origin__", None) is Literal else ()
    if choices:
        if value not in choices:
            raise ConfigError(f"{where}: {key} = {value!r} is not allowed; use one of {', '.join(choices)}")
        return value
    if expected is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key} = {value!r} must be true or false")
        return value
    if expected is int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{where}: {key} = {value!r} must be a whole number >= 0")
        return value
    if expected is float:
        # Not `value < 0`: NaN passes that, and NaN or an infinity would be written back to the file.
        if isinstance(value, bool) or not isinstance(value, _NON_NEGATIVE) or not 0 <= value < math.inf:
            raise ConfigError(f"{where}: {key} = {value!r} must be a finite number >= 0")
        return float(value)
    if expected is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {key} = {value!r} must be a string")
        return value
    if getattr(expected, "__origin__", None) is list:
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ConfigError(f"{where}: {key} = {value!r} must be a list of strings")
        return list(value)
    raise AssertionError(f"unhandled config type {expected!r}")


def from_dict(data: dict[str, Any], source: str = "config") -> Config:
    """Build and validate a Config; unknown sections or keys are errors (a typo must not be ignored)."""
    config = Config(source=source)
    for section_name, section_value in data.items():
        if section_name == "models":
            config.models = _library_models(source, section_value)
            continue
        if section_name == "peers":
            config.peers = _peers(source, section_value)
            continue
        if section_name == "notify":
            try:
                config.notify = notify.channels_from_config(source, section_value)
            except ValueError as error:
                raise ConfigError(str(error)) from None
            for number, channel in enumerate(config.notify, 1):  # notify.py's `< 0` lets NaN through
                _check_value(source, f"notify[{number}].coalesce_seconds", float, channel.coalesce_seconds)
            continue
        section = getattr(config, section_name, None)
        if not dataclasses.is_dataclass(section):
            allowed = ", ".join(f.name for f in fields(Config) if f.name not in ("source", "overrides"))
            raise ConfigError(f"{source}: unknown section [{section_name}]; sections are {allowed}")
        if not isinstance(section_value, dict):
            raise ConfigError(f"{source}: [{section_name}] must be a table")
        _fill_section(source, section_name, section, section_value)
    _check_relations(config)
    return config


def _fill_section(source: str, section_name: str, section: Any, values: dict[str, Any]) -> None:
    hints = get_type_hints(type(section))
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(
                f"{source}: unknown key {section_name}.{key}; keys are {', '.join(sorted(hints))}"
            )
        checked = _check_value(source, f"{section_name}.{key}", hints[key], value)
        if (section_name, key) in _REQUIRED_SIZES and not checked:
            raise ConfigError(f'{source}: {section_name}.{key} must be a size, such as "4MiB"; it is empty')
        if (section_name, key) in _SIZE_KEYS and checked:
            try:
                parse_size(checked)
            except ValueError as error:
                raise ConfigError(f"{source}: {section_name}.{key}: {error}") from None
        setattr(section, key, checked)


def _library_models(source: str, value: Any) -> list[LibraryModelConfig]:
    """The `[[models]]` tables, each checked as a section is; names and files are checked by the library."""
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ConfigError(f"{source}: models must be [[models]] tables")
    entries = []
    for number, table in enumerate(value, 1):
        entry = LibraryModelConfig()
        _fill_section(source, f"models[{number}]", entry, table)
        if not entry.name or not entry.path:
            raise ConfigError(f"{source}: models[{number}] needs a name and a path")
        unknown = [device for device in entry.devices if device not in ("gpu", "cpu")]
        if unknown or not entry.devices:
            raise ConfigError(f'{source}: models[{number}].devices must list "gpu" and/or "cpu"')
        entries.append(entry)
    return entries


def _peers(source: str, value: Any) -> list[peers.PeerConfig]:
    """The `[[peers]]` tables, each checked as a section is, then its name, URL, key and slots."""
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ConfigError(f"{source}: peers must be [[peers]] tables")
    entries: list[peers.PeerConfig] = []
    for number, table in enumerate(value, 1):
        entry = peers.PeerConfig()
        _fill_section(source, f"peers[{number}]", entry, table)
        found = peers.problem(entry)
        if found is not None:
            key, what = found
            raise ConfigError(f"{source}: peers[{number}].{key} {what}")
        taken = [index for index, other in enumerate(entries, 1) if other.name == entry.name]
        if taken:
            raise ConfigError(
                f"{source}: peers[{number}].name = {entry.name!r} is taken by peers[{taken[0]}]; "
                "each peer needs a name of its own"
            )
        entry.url = peers.normalized_url(entry.url) if entry.url else ""
        entries.append(entry)
    return entries


def _check_relations(config: Config) -> None:
    source = config.source
    if not 0 <= config.budget.reserve_percent < 100:
        raise ConfigError(
            f"{source}: budget.reserve_percent = {config.budget.reserve_percent} must be in [0, 100)"
        )
    if config.budget.n_parallel < 1:
        raise ConfigError(f"{source}: budget.n_parallel must be at least 1")
    if config.embeddings.n_parallel < 1 or config.embeddings.n_ctx < 64:
        raise ConfigError(f"{source}: embeddings.n_parallel must be at least 1 and n_ctx at least 64")
    if config.embeddings.max_request_tokens < 1:
        raise ConfigError(f"{source}: embeddings.max_request_tokens must be at least 1")
    if config.device.poll_seconds <= 0 or config.gpu.max_returns < 1:
        raise ConfigError(f"{source}: device.poll_seconds must be above 0 and gpu.max_returns at least 1")
    if config.cpu.mirror_slots < 1:
        raise ConfigError(f"{source}: cpu.mirror_slots must be at least 1 (cpu.mirror = false turns it off)")
    if config.failover.max_pending_approvals < 1:
        raise ConfigError(f"{source}: failover.max_pending_approvals must be at least 1")
    if config.budget.cache_type != "f16" and not config.budget.flash_attn:
        # llama.cpp refuses a quantised V cache without flash attention.
        raise ConfigError(
            f"{source}: budget.cache_type = {config.budget.cache_type!r} needs budget.flash_attn = true"
        )
    if not 1 <= config.server.port <= 65535:
        raise ConfigError(f"{source}: server.port = {config.server.port} must be in 1..65535")
    name = config.model.name
    if "," in name or name != name.strip():  # llama-server splits its --alias at commas
        raise ConfigError(f"{source}: model.name = {name!r} must have no comma and no space at either end")
    url_error = config.server.public_url and notify.public_url_error(config.server.public_url)
    if url_error:
        raise ConfigError(f"{source}: server.public_url = {config.server.public_url!r} {url_error}")
    _check_allow_lists(config)


def _check_allow_lists(config: Config) -> None:
    source, server = config.source, config.server
    for key in ("allowed_hosts", "allowed_origins"):
        if "*" in getattr(server, key) and not server.api_key:
            # "*" lets any web page (or any DNS name) reach the API: only the key then keeps pages out.
            raise ConfigError(f'{source}: server.{key} = ["*"] needs server.api_key (see README "Security")')
    for origin in server.allowed_origins:
        if origin != "*" and normalize_origin(origin) is None:
            raise ConfigError(
                f"{source}: server.allowed_origins: {origin!r} is not an origin "
                '(scheme://host[:port] with http or https, e.g. "http://localhost:3000")'
            )
    for host in server.allowed_hosts:
        if not host or "/" in host or " " in host:
            raise ConfigError(f"{source}: server.allowed_hosts: {host!r} is not a host name")


def apply_overrides(cfg: Config, overrides: dict[str, Any]) -> Config:
    """The config with command-line values put over it, validated like the file, remembering them."""
    data = cfg.to_dict()
    for name, value in overrides.items():
        section, key = name.split(".")
        data[section][key] = value
    _forget_name_of_another_file(cfg.to_dict(), data, named="model.name" in overrides)
    result = from_dict(data, source=cfg.source)
    result.overrides = dict(overrides)
    return result


def _forget_name_of_another_file(old: dict[str, Any], new: dict[str, Any], *, named: bool) -> None:
    """model.name was given for the file at model.path: a new file given without a name of its own (the
    tray's settings, `serve --model`) goes by its file name, not by the name of the one it replaces."""
    if new["model"]["path"] != old["model"]["path"] and not named:
        new["model"]["name"] = ""
