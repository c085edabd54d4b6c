"""The TOML config: typed sections with defaults, validated on load; errors name file, key and choices.

By concern: `schema.py` (the sections and `Config`), `validation.py` (`from_dict`, the checks, the command
line's overrides), `files.py` (`load`, `save`, `write_private`, `edit_file`), `live.py` (what a running
service takes over without a restart, what only the file sets), `view.py` (`public_view`), `command.py`
(`load_config` for the commands, `failsoft config`); `notify.py` (the `[[notify]]` tables), `peers.py` (the
`[[peers]]` tables and where plain HTTP may go) and `origins.py` (host names and origins, for the checks here
and the request guard)."""

from __future__ import annotations

from tray_app.config.command import load_config, show_config
from tray_app.config.files import edit_file, load, save, write_private
from tray_app.config.live import (
    FILE_ONLY,
    LIVE_CPU_KEYS,
    LIVE_EMBEDDINGS_KEYS,
    LIVE_LIBRARY_KEYS,
    LIVE_SECTIONS,
    LIVE_SERVER_KEYS,
    changed_keys,
    file_only,
    is_live,
    with_live_changes,
)
from tray_app.config.notify import NotifyConfig
from tray_app.config.peers import PeerConfig
from tray_app.config.schema import (
    BudgetConfig,
    CacheType,
    Config,
    ConfigError,
    CpuConfig,
    DeviceConfig,
    EmbeddingsConfig,
    EngineConfig,
    FailoverConfig,
    FallbackPolicy,
    GpuConfig,
    JournalConfig,
    LibraryConfig,
    LibraryModelConfig,
    ModelConfig,
    Pooling,
    ServerConfig,
    StandInPolicy,
    StreamFailurePolicy,
    SupervisorConfig,
)
from tray_app.config.validation import apply_overrides, from_dict
from tray_app.config.view import public_view

__all__ = [
    "FILE_ONLY",
    "LIVE_CPU_KEYS",
    "LIVE_EMBEDDINGS_KEYS",
    "LIVE_LIBRARY_KEYS",
    "LIVE_SECTIONS",
    "LIVE_SERVER_KEYS",
    "BudgetConfig",
    "CacheType",
    "Config",
    "ConfigError",
    "CpuConfig",
    "DeviceConfig",
    "EmbeddingsConfig",
    "EngineConfig",
    "FailoverConfig",
    "FallbackPolicy",
    "GpuConfig",
    "JournalConfig",
    "LibraryConfig",
    "LibraryModelConfig",
    "ModelConfig",
    "NotifyConfig",
    "PeerConfig",
    "Pooling",
    "ServerConfig",
    "StandInPolicy",
    "StreamFailurePolicy",
    "SupervisorConfig",
    "apply_overrides",
    "changed_keys",
    "edit_file",
    "file_only",
    "from_dict",
    "is_live",
    "load",
    "load_config",
    "public_view",
    "save",
    "show_config",
    "with_live_changes",
    "write_private",
]
