"""The paths of Ollama's API this service answers (or refuses in Ollama's words). Kept apart from the
routes so the outermost layer (origin_guard, app.AuthAndErrors) can know them without importing the router.

Failsoft's own control routes live under `/failsoft/` (origin_guard.CONTROL_PREFIX), outside Ollama's
`/api/`: tests/ollama_api/test_translate.py checks that no path here is one of them.
"""

from __future__ import annotations

from tray_app.server.dialect import Dialect, plain_error_body

CHAT = "/api/chat"
GENERATE = "/api/generate"
# Answered with Ollama's error shape: models are managed in Failsoft's config file.
MODEL_MANAGEMENT = ("/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete")
EMBED = ("/api/embed", "/api/embeddings")  # the current route, and the older one
OLLAMA_PATHS = frozenset(
    {
        "/",
        "/api/version",
        "/api/tags",
        "/api/show",
        "/api/ps",
        CHAT,
        GENERATE,
        *MODEL_MANAGEMENT,
        *EMBED,
    }
)
BLOBS_PREFIX = "/api/blobs/"  # Ollama's upload of model files for /api/create: refused like create


def is_ollama_path(path: str) -> bool:
    return path in OLLAMA_PATHS or path.startswith(BLOBS_PREFIX)


DIALECT = Dialect("ollama", is_ollama_path, plain_error_body)
