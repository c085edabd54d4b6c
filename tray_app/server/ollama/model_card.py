"""What Ollama's /api/tags, /api/show and /api/ps say about the service's model, read from its GGUF file:
family, parameter count, quantisation, metadata, the chat template, a digest.

Read once per file version (path, size, modification time) and kept in memory.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Files up to this size are hashed whole (the digest is the file's sha256, as Ollama's is, about a second
# per GiB once); a larger file gets a stable id instead (sha256 over its name, size, modification time and
# its first and last MiB), so a list of models never waits minutes for a hash.
HASH_WHOLE_FILE_MAX = 2 * 1024**3
_EDGE = 1024**2
_ARRAY_FIELDS_SHOWN = 8  # longer arrays (tokens, merges, scores) are shown empty, as Ollama does
_lock = threading.Lock()
_cards: dict[tuple[str, int, int], ModelCard] = {}


@dataclass(frozen=True)
class ModelCard:
    path: str
    size: int
    modified: float
    digest: str
    digest_is_sha256: bool
    family: str
    parameter_count: int
    quantization: str
    chat_template: str
    context_length: int
    model_info: dict[str, Any]

    def details(self) -> dict[str, Any]:
        return {
            "parent_model": "",
            "format": "gguf",
            "family": self.family,
            "families": [self.family],
            "parameter_size": parameter_size(self.parameter_count),
            "quantization_level": self.quantization,
        }


def parameter_size(count: int) -> str:
    """Ollama's way of writing a parameter count: 135M, 134.52M, 8.0B."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            value = count / scale
            if value == int(value):
                return f"{int(value)}{unit}"
            return f"{value:.1f}{unit}" if unit == "B" else f"{value:.2f}{unit}"
    return str(count)


def _digest(path: Path, size: int, mtime_ns: int) -> tuple[str, bool]:
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        if size <= HASH_WHOLE_FILE_MAX:
            while chunk := handle.read(4 * 1024**2):
                sha.update(chunk)
            return sha.hexdigest(), True
        sha.update(f"{path.name}\0{size}\0{mtime_ns}\0".encode())
        sha.update(handle.read(_EDGE))
        handle.seek(max(size - _EDGE, 0))
        sha.update(handle.read(_EDGE))
    return sha.hexdigest(), False


def _scalar(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return value


def _fields(path: Path) -> tuple[dict[str, Any], int, str]:
    """The GGUF key-value metadata (long arrays shown empty), the parameter count from the tensors and the
    chat template."""
    from gguf import (
        GGUFReader,  # the planner reads the same file the same way (tray_app.budget.model_info)
    )

    reader = GGUFReader(str(path), "r")
    info: dict[str, Any] = {}
    template = ""
    for name, entry in reader.fields.items():
        if name == "tokenizer.chat_template":
            template = str(entry.contents())  # shown on its own, as Ollama's `template`
            continue
        if name.startswith("GGUF."):
            continue  # the container's own header (version, counts), not the model's metadata
        if len(entry.data) > _ARRAY_FIELDS_SHOWN:
            info[name] = []  # a long array (tokens, merges, scores): not read at all
            continue
        try:
            value = entry.contents()
        except (ValueError, IndexError, TypeError):
            continue
        if isinstance(value, list):
            value = [_scalar(item) for item in value] if len(value) <= _ARRAY_FIELDS_SHOWN else []
        info[name] = _scalar(value)
    parameters = sum(int(tensor.n_elements) for tensor in reader.tensors)
    return info, parameters, template


def _quantization(info: dict[str, Any]) -> str:
    file_type = info.get("general.file_type")
    if isinstance(file_type, int):
        try:
            from gguf import LlamaFileType

            name = LlamaFileType(file_type).name
        except ValueError:
            return str(file_type)
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    return "unknown"


def model_card(path: Path) -> ModelCard:
    """The card of the GGUF file at `path` (read and hashed the first time; blocking: call from a thread)."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _lock:
        if key in _cards:
            return _cards[key]
        info, counted, template = _fields(path)
        digest, whole = _digest(path, stat.st_size, stat.st_mtime_ns)
        family = str(info.get("general.architecture") or "unknown")
        count = info.get("general.parameter_count")
        context = info.get(f"{family}.context_length")
        card = ModelCard(
            path=str(path),
            size=stat.st_size,
            modified=stat.st_mtime,
            digest=digest,
            digest_is_sha256=whole,
            family=family,
            parameter_count=int(count) if isinstance(count, int) else counted,
            quantization=_quantization(info),
            chat_template=template,
            context_length=int(context) if isinstance(context, int) else 0,
            model_info=info,
        )
        _cards[key] = card
        return card
