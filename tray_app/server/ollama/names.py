"""The service's models in Ollama's terms: their names and tags, what they can do, the version this API
claims, and the answer to the model management it does not do."""

from __future__ import annotations

from typing import Any

from tray_app.library.catalog import LATEST, resolve_name
from tray_app.server.ollama.errors import OllamaError

# Open WebUI takes the lowest version over its Ollama backends and turns features off below the versions
# that brought them (structured outputs in `format` came with 0.5, `think` with 0.9, tool calls while
# streaming with 0.8): a recent version keeps them on. Our shapes follow Ollama 0.12's API.
OLLAMA_VERSION = "0.12.0"
MANAGED_IN_CONFIG = (
    "models are managed in Failsoft's config file ([model] path in config.toml, or the tray's settings), "
    "not through the Ollama API; this service serves {names}"
)


def model_name(model_id: str) -> str:
    """The name a model goes by in Ollama's lists: the file's name without `.gguf`, with `:latest` unless
    it has a tag already (a model added from Ollama's store keeps its `name:tag`)."""
    base = model_id[: -len(".gguf")] if model_id.lower().endswith(".gguf") else model_id
    return base if ":" in base.rpartition("/")[2] else base + LATEST


def matches_model(name: str, known: set[str]) -> bool:
    """Whether an Ollama model name means one of the service's models: one of its names (the file name, its
    stem, the path, "default"), as Ollama reads names (letter case aside, `:latest` or not: resolve_name)."""
    return resolve_name(name, known) is not None


def public_names(known: set[str]) -> str:
    return ", ".join(sorted(name for name in known if "/" not in name and "\\" not in name))


def not_found(name: str) -> OllamaError:
    return OllamaError(404, f"model '{name}' not found")


def require_model(body: dict[str, Any], known: set[str]) -> str:
    """The model the request names (`model`, or the older `name`); 400 when absent, 404 when unknown."""
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise OllamaError(400, "model is required")
    if not matches_model(name, known):
        raise not_found(name)
    return name


def managed_in_config(known: set[str]) -> OllamaError:
    """pull, push, create, copy, delete: 501 Not Implemented, not 400: the request is well formed, this
    server just does not manage models over HTTP, and no change to the request would make it."""
    return OllamaError(501, MANAGED_IN_CONFIG.format(names=public_names(known)))


def capabilities(thinks: bool) -> list[str]:
    """What /api/show says a model can do (Ollama's names)."""
    return ["completion", "tools", *(["thinking"] if thinks else [])]
