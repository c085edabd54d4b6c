"""Errors in the OpenAI format: `{"error": {"message", "type", "param", "code"}}`, plus failsoft details."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tray_app.jobs.outcomes import JobError


@dataclass
class ApiError(Exception):
    """An answer the router gives on purpose: a status, an OpenAI-style error and optional headers."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. job_id, reason: added inside "error"

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        error.update(self.extra)
        return {"error": error}

    def body_bytes(self) -> bytes:
        return json.dumps(self.body()).encode()


def bad_request(message: str, param: str | None = None, code: str = "invalid_request") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unavailable(message: str, code: str, retry_after: int, **extra: Any) -> ApiError:
    """A controlled 503: the job could not be finished now; the code says why, Retry-After says when."""
    return ApiError(
        503,
        message,
        type="service_unavailable",
        code=code,
        headers={"Retry-After": str(retry_after)},
        extra=extra,
    )


def from_job_error(error: JobError) -> ApiError:
    """The engine's reason a job ended, as the answer a client gets."""
    headers = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else {}
    return ApiError(
        error.status,
        error.message,
        type=error.type,
        code=error.code,
        param=error.param,
        headers=headers,
        extra=error.details,
    )
