"""The paths of Anthropic's Messages API this service answers, and the shape of its errors. Kept apart from
the routes so the outermost layer (http.AuthAndErrors) can answer in Anthropic's words without importing the
router."""

from __future__ import annotations

import json

from tray_app.server.dialect import Dialect

MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
PATHS = frozenset({MESSAGES, COUNT_TOKENS})

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors); others are api_error.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",  # an Idempotency-Key already in use
    413: "request_too_large",
    422: "invalid_request_error",  # an Idempotency-Key used with another body
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    return path in PATHS


def error_body(status: int, message: str) -> bytes:
    """An error as Anthropic's API and SDKs have it: `{"type": "error", "error": {"type", "message"}}`."""
    error = {"type": ERROR_TYPES.get(status, "api_error"), "message": message}
    return json.dumps({"type": "error", "error": error}).encode()


def _error_body(status: int, message: str, openai_body: bytes) -> bytes:
    return error_body(status, message)


DIALECT = Dialect("anthropic", is_anthropic_path, _error_body)
