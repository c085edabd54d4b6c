"""GGUF models other programs already put on this machine: Ollama's store, LM Studio's models folder and the
Hugging Face hub cache. Only read: `failsoft models add` points the config at a file found here, never copies.

- Ollama: `manifests/HOST/NAMESPACE/MODEL/TAG` are JSON manifests whose layer of media type
  `application/vnd.ollama.image.model` names the GGUF by digest; the file is `blobs/sha256-HEX`.
- LM Studio: `PUBLISHER/REPO/*.gguf` under its models folder.
- Hugging Face: `models--ORG--NAME/snapshots/REVISION/**/*.gguf` (links into the cache's blobs).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_LIBRARY = ("registry.ollama.ai", "library")
# Where Ollama's Linux installer puts the store of its service (the `ollama` user's home).
SYSTEM_OLLAMA_STORES = (Path("/usr/share/ollama/.ollama/models"),)
SOURCES = ("ollama", "lm-studio", "hf-cache")
GGUF_MAGIC = b"GGUF"
# A split model is loaded from its first part; llama.cpp finds the others beside it.
_LATER_SPLIT = re.compile(r"-(\d{5})-of-\d{5}\.gguf$")


@dataclass(frozen=True)
class FoundModel:
    name: str  # what `failsoft models add` takes, and the library name it gets by default
    path: Path
    source: str  # one of SOURCES
    detail: str  # Ollama's model:tag, LM Studio's publisher/repo, the Hugging Face repo
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "path": str(self.path)}


@dataclass(frozen=True)
class Store:
    source: str
    root: Path


def stores(env: Mapping[str, str] | None = None, home: Path | None = None) -> list[Store]:
    """The folders looked in, each once, in this order: Ollama's, LM Studio's, the Hugging Face cache."""
    env = os.environ if env is None else env
    home = home or Path(env.get("HOME") or Path.home())
    ollama = [Path(env["OLLAMA_MODELS"])] if env.get("OLLAMA_MODELS") else []
    ollama += [home / ".ollama" / "models", *SYSTEM_OLLAMA_STORES]
    lm_studio = [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    cache_home = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
    hf = [Path(env[key]) for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE") if env.get(key)]
    if env.get("HF_HOME"):
        hf.append(Path(env["HF_HOME"]) / "hub")
    hf.append(cache_home / "huggingface" / "hub")
    found: list[Store] = []
    seen: set[Path] = set()
    for source, roots in (("ollama", ollama), ("lm-studio", lm_studio), ("hf-cache", hf)):
        for root in roots:
            key = root.expanduser().resolve()
            if key not in seen and key.is_dir():
                seen.add(key)
                found.append(Store(source, root.expanduser()))
    return found


def discover(env: Mapping[str, str] | None = None, home: Path | None = None) -> list[FoundModel]:
    """Every GGUF model found in the stores, each file once (the first store that has it names it)."""
    readers = {"ollama": ollama_models, "lm-studio": lm_studio_models, "hf-cache": hf_cache_models}
    found: list[FoundModel] = []
    files: set[Path] = set()
    for store in stores(env, home):
        for model in readers[store.source](store.root):
            key = model.path.resolve()
            if key not in files:
                files.add(key)
                found.append(model)
    return found


def is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as stream:
            return stream.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _chat_model_file(path: Path) -> bool:
    """A GGUF to chat with: not a vision projector, not a split model's later part, really GGUF."""
    name = path.name.lower()
    if "mmproj" in name:
        return False
    later = _LATER_SPLIT.search(name)
    if later and int(later.group(1)) != 1:
        return False
    return is_gguf(path)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    """As `ollama list` shows it: `model:tag` for the default library, else with namespace (and host)."""
    if (host, namespace) == OLLAMA_LIBRARY:
        return f"{model}:{tag}"
    if host == OLLAMA_LIBRARY[0]:
        return f"{namespace}/{model}:{tag}"
    return f"{host}/{namespace}/{model}:{tag}"


def ollama_models(root: Path) -> Iterator[FoundModel]:
    manifests = root / "manifests"
    for manifest in sorted(manifests.glob("*/*/*/*")):
        if not manifest.is_file():
            continue
        try:
            layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers") or []
        except (OSError, ValueError, AttributeError):
            continue  # unreadable or not a manifest: another program's business
        digest = next(
            (layer.get("digest", "") for layer in layers if isinstance(layer, dict)
             and layer.get("mediaType") == OLLAMA_MODEL_LAYER),
            "",
        )  # fmt: skip
        if not isinstance(digest, str) or not digest.startswith("sha256:"):
            continue
        blob = root / "blobs" / digest.replace(":", "-")
        if not is_gguf(blob):
            continue
        host, namespace, model, tag = manifest.relative_to(manifests).parts
        name = ollama_name(host, namespace, model, tag)
        yield FoundModel(name, blob, "ollama", name, _size(blob))


def lm_studio_models(root: Path) -> Iterator[FoundModel]:
    for path in sorted(root.glob("*/*/*.gguf")):
        if _chat_model_file(path):
            publisher, repo = path.relative_to(root).parts[:2]
            yield FoundModel(path.stem, path, "lm-studio", f"{publisher}/{repo}", _size(path))


def hf_cache_models(root: Path) -> Iterator[FoundModel]:
    for repo in sorted(root.glob("models--*")):
        repo_id = "/".join(repo.name.split("--")[1:])
        seen: set[Path] = set()  # a file kept by several revisions: the preferred revision's
        for snapshot in _snapshots(repo):
            for path in sorted(snapshot.rglob("*.gguf")):
                relative = path.relative_to(snapshot)
                if relative not in seen and _chat_model_file(path):
                    seen.add(relative)
                    yield FoundModel(path.stem, path, "hf-cache", repo_id, _size(path))


def _snapshots(repo: Path) -> list[Path]:
    """The revision refs/main names first (what the hub hands out today), then the others, newest first."""
    snapshots = [path for path in (repo / "snapshots").glob("*") if path.is_dir()]
    try:
        main = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except OSError:
        main = ""
    return sorted(snapshots, key=lambda path: (path.name != main, -_mtime(path)))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
