"""Errors in Ollama's shape (`{"error": message}` with an HTTP status), and the router's OpenAI errors
as those."""

from __future__ import annotations

import json


class OllamaError(Exception):
    """An answer in Ollama's error shape: `{"error": message}` with an HTTP status."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}

    def body(self) -> dict[str, str]:
        return {"error": self.message}

    def body_bytes(self) -> bytes:
        return json.dumps(self.body()).encode()


def openai_error(status: int, body: bytes) -> OllamaError:
    """An OpenAI error answer (`{"error": {"message": ...}}`) as Ollama's, with the same status."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        data = None
    message = None
    if isinstance(data, dict):
        error = data.get("error")
        message = error.get("message") if isinstance(error, dict) else error
    if not isinstance(message, str) or not message:
        message = body.decode("utf-8", "replace").strip() or f"HTTP {status}"
    return OllamaError(status, message)
