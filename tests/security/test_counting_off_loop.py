"""A long prompt is counted without stopping the event loop (issue 36), and no longer in the service's own
process at all: the tokenizer helper counts it while every other client is answered."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.security.conftest import ADMIN_TOKEN, BASE_URL, StandInService
from tray_app.reach import admin_token
from tray_app.server.routes import create_app
from tray_app.tokenizer.model_tokens import ModelTokens
from tray_app.tokenizer.process import TokenizerProcess


@pytest.fixture
async def helper(model_path: Path, tmp_path: Path) -> AsyncIterator[TokenizerProcess]:
    process = TokenizerProcess(tmp_path / "tokenizer.log", preload=[(model_path, "")])
    process.start()
    yield process
    await process.aclose()


async def test_the_event_loop_answers_while_a_long_prompt_is_counted(
    make_service: Any, model_path: Path, helper: TokenizerProcess
) -> None:
    """Counting a 1 MiB prompt takes a good part of a second: the service's loop answers /health meanwhile,
    because the count is a request to the helper process."""
    service: StandInService = make_service()
    tokens = ModelTokens(helper, model_path)
    counted: list[float] = []

    class Timed(ModelTokens):
        async def count(self, kind: str, body: dict[str, Any]) -> int:
            started = time.monotonic()
            try:
                return await tokens.count(kind, body)
            finally:
                counted.append(time.monotonic() - started)

    timed = Timed(helper, model_path)
    service.prompts = lambda model="": timed  # type: ignore[method-assign]
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
