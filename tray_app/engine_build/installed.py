"""Which engine this environment has: the variant that `failsoft engine build` installed (its marker beside
the environment) and the Python binding's version."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

_VARIANT = re.compile(r"llama-cpp-python-(?P<version>[\d.]+)-(?P<backend>[a-z]+)-[0-9a-f]+")


def installed_variant(prefix: Path | None = None) -> dict[str, str]:
    """{"variant", "version", "backend"} of the build installed here; {} when none was (e.g. a pip-built
    binding, or llama-cpp-python not installed at all)."""
    marker = (prefix or Path(sys.prefix)) / ".engine-variant"
    try:
        name = marker.read_text().strip()
    except OSError:
        return {}
    found = _VARIANT.fullmatch(name)
    return {"variant": name, **(found.groupdict() if found else {})}


def binding_version() -> str | None:
    """llama-cpp-python's version, None when it is not installed (found without loading the library)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def in_virtual_env() -> bool:
    """Whether this interpreter runs in a virtual environment (pipx, venv): the engine goes in there."""
    return sys.prefix != sys.base_prefix
