"""End a failing stream with an OpenAI error object instead of a cut connection.

llama-cpp-python's server sends a streamed completion from `get_event_publisher`; an exception raised while
generating (a real or injected `llama_decode returned -2`) escapes after the response has started, and the
client only sees the connection drop. Here the chunk iterator is wrapped so the error goes out as one
`data: {"error": {...}}` event (the same shape as the server's non-streamed errors), followed by `[DONE]`.
The OpenAI SDK raises on such an event; a router can read the message and tell a decode OOM from a crash.
Most streams go through `lean_stream`, which ends a failing stream the same way with `error_chunk`; this
wrapper covers the streams it leaves to llama-cpp-python.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import llama_cpp.server.app as llama_server

from tray_app.worker.errors import error_body

log = logging.getLogger(__name__)
_installed = False


def error_chunk(error: BaseException) -> dict[str, Any]:
    # An error without a message (a bare AssertionError, a MemoryError) is named by its type.
    return error_body(str(error) or type(error).__name__, "internal_server_error")


def _chunks_or_error(chunks: Iterator[Any]) -> Iterator[Any]:
    try:
        yield from chunks
    except Exception as error:
        traceback.print_exc()
        yield error_chunk(error)


def _with_error_chunk(llama_call: Callable[..., Any]) -> Callable[..., Any]:
    def call(llama: Any, **kwargs: Any) -> Any:
        result = llama_call(llama, **kwargs)
        return _chunks_or_error(result) if isinstance(result, Iterator) else result

    return call


def install() -> None:
    """Wrap the server's streaming publisher (once per process; the routes look it up at call time)."""
    global _installed
    if _installed:
        return
    original = llama_server.get_event_publisher

    async def publisher(**kwargs: Any) -> None:
        kwargs["llama_call"] = _with_error_chunk(kwargs["llama_call"])
        await original(**kwargs)

    llama_server.get_event_publisher = publisher  # type: ignore[assignment]
    _installed = True
