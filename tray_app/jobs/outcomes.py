"""What the job engine tells whoever serves the client: a piece of the answer, its end, or why the job ended
without one. Plain data, no HTTP: the server turns them into server-sent events (tray_app.server.streaming)
or into a status and a JSON body."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class JobError:
    """Why a job ended without an answer, in the vocabulary clients get: an HTTP-like status class (400: the
    request; 429: busy; 500: the router; 503: cannot be served now), a stable code, words, and details
    (`job_id`, `reason`)."""

    status: int
    code: str
    message: str
    type: str = "service_unavailable"
    retry_after: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    param: str | None = None  # the request field at fault, when one is

    def public(self) -> dict[str, Any]:
        """OpenAI's error object: message, type, param, code, and the details."""
        return {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
            **self.details,
        }

    def record(self) -> dict[str, Any]:
        """What the job keeps (`job.error`): the public object and the status."""
        return {**self.public(), "status": self.status}

    @classmethod
    def from_record(cls, record: dict[str, Any] | None) -> JobError:
        """Back from what a job keeps (nothing kept: an unknown end)."""
        fields = dict(record or {"message": "the job ended without an answer", "code": "no_answer"})
        status = int(fields.pop("status", 503))
        message = str(fields.pop("message", ""))
        code = str(fields.pop("code", "") or "no_answer")
        kind = str(fields.pop("type", "service_unavailable") or "service_unavailable")
        param = fields.pop("param", None)
        return cls(status, code, message, type=kind, details=fields, param=param)


class JobFailed(Exception):
    """Raised by a part of the engine that answers whole (embeddings): the job ended with `error`."""

    def __init__(self, error: JobError) -> None:
        super().__init__(error.message)
        self.error = error


def cannot_serve(message: str, code: str, retry_after: int, **details: Any) -> JobError:
    """The job could not be finished now: the code says why, retry_after when to try again."""
    return JobError(503, code, message, retry_after=retry_after, details=details)


@dataclass(frozen=True)
class Piece:
    """A chunk of the answer for the client: `raw` as the worker sent it, or `obj` reshaped by the engine."""

    obj: dict[str, Any]
    raw: str | None = None
    output: bool = False  # it carries text or a tool call: what the client is waiting for
    before: tuple[Piece, ...] = ()  # held back until this one (a role announcement): sent just ahead of it


@dataclass(frozen=True)
class Finished:
    """The answer is complete. `chunk_id`, `created`, `model` shape the stream's last chunk like the rest;
    `replayed`: the whole answer, made while the client waited for someone else's run (an approval)."""

    result: dict[str, Any]
    chunk_id: str = ""
    created: int = 0
    model: str = ""
    replayed: bool = False


@dataclass(frozen=True)
class Ended:
    """The job ended without an answer."""

    error: JobError


Outcome = Piece | Finished | Ended
