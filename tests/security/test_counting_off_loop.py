"""A long prompt is counted off the event loop (issue 36): counting the largest body the service takes
(`server.max_body`, 4 MiB) takes seconds, and on the loop every other client waited meanwhile."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from tests.security.conftest import ADMIN_TOKEN, BASE_URL, StandInService
from tray_app import admin_token
from tray_app.jobs.admission import TokenCounter
from tray_app.server.routes import create_app


async def test_the_event_loop_answers_while_a_long_prompt_is_counted(
    make_service: Any, model_path: Path
) -> None:
    """Counting a 4 MiB prompt (`server.max_body`) takes seconds, and it ran on the event loop: every other
    client, the tray's status poll included, waited. Now a long prompt is counted on a thread."""
    service: StandInService = make_service()
    counter = TokenCounter(model_path)
    counted: list[float] = []

    def count_prompt(kind: str, body: dict[str, Any], model: str = "") -> int:
        started = time.monotonic()
        tokens = counter.count_chat(body) if kind == "chat" else counter.count_completion(body)
        counted.append(time.monotonic() - started)
        return tokens

    service.count_prompt = count_prompt  # type: ignore[method-assign]
    content = "the river ran past the old mill and on to the sea; " * 20_000  # 1 MiB
    headers = admin_token.headers(ADMIN_TOKEN)
    transport = httpx.ASGITransport(app=create_app(service, manage_lifecycle=False))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, headers=headers) as http:
        body = {"model": "model.gguf", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
        chat = asyncio.create_task(http.post("/v1/chat/completions", json=body, timeout=60))
        gaps: list[float] = []  # between answers to the health checks sent one after another meanwhile
        last = time.monotonic()
        while not chat.done():
            assert (await http.get("/health")).status_code == 200
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()
        await chat
    # The count took long enough for a stopped loop to show in the gaps (about 0.3 s here; 10 ms polls).
    assert counted and counted[0] > 0.1
    assert max(gaps) < counted[0] / 2, f"the loop stopped {max(gaps):.2f}s; the count took {counted[0]:.2f}s"
