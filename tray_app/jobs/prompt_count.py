"""A request's prompt counted without stopping the event loop: tokenizing 4 MiB (the default
`server.max_body`) takes 1.5 s on a 2-core machine, several seconds when it is busy, and every client of
the service waits while the loop does. A long prompt is counted on a thread; llama.cpp's tokenizer takes
concurrent calls on one vocabulary (llama-server tokenizes on its HTTP threads) and releases the GIL, and
the counter's caches lock (jobs.count_cache). A short one is counted at once: a thread's hop would cost
more than the count."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

COUNT_INLINE_CHARS = 64 * 1024  # more text than this is counted off the event loop


def prompt_chars(kind: str, body: dict[str, Any]) -> int:
    """About how much text a request's prompt holds: its messages' (or its prompt's) characters, their tool
    calls' arguments and the tools' definitions (a template renders them all into the prompt)."""
    if kind != "chat":
        prompt = body.get("prompt")
        return len(prompt) if isinstance(prompt, str) else sum(len(str(part)) for part in prompt or ())
    tools = body.get("tools")
    total = len(json.dumps(tools)) if tools else 0
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(str(part.get("text", ""))) for part in content if isinstance(part, dict))
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            total += len(str(function.get("arguments", ""))) if isinstance(function, dict) else 0
    return total


async def count_off_loop(count: Callable[[], int], kind: str, body: dict[str, Any]) -> int:
    """`count()`, the tokens of this request's prompt: on a thread when the prompt is long."""
    if prompt_chars(kind, body) <= COUNT_INLINE_CHARS:
        return count()
    return await asyncio.to_thread(count)
