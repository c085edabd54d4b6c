"""The OpenAI error shape, as the worker answers it: as a response, or as the payload of an error event."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse


def error_body(message: str, kind: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def openai_error(
    status: int, message: str, kind: str, code: str | None = None, param: str | None = None
) -> JSONResponse:
    return JSONResponse(error_body(message, kind, code, param), status_code=status)
