"""The well-behaved part of the chaos mix: OpenAI chat streams (with and without a forced tool call), a
whole tool call, Ollama and Anthropic streams, background jobs (polled, and retried under their
Idempotency-Key) and embeddings. Each fills in a `Sent`; none raises for what the service answers."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from tray_app.contract.vocabulary import FINAL_JOB_STATES
from tray_app.drill.bodies import ADD_TOOL, BASE, FORCE_ADD, SEA
from tray_app.drill.chaos_records import (
    Sent,
    error_of,
    plain_answer,
    read_anthropic,
    read_ollama,
    read_openai,
)

ADD = [{"role": "user", "content": "Add 2 and 3 with the add tool."}]
SHORT = 16  # tokens: enough to be an answer, short enough for hundreds of them on two cores
TOOL_TOKENS = 48  # a whole `add` call, arguments included
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01"}
JOB_POLL = 0.25

Reader = Callable[[Sent, str], None]


def openai_chat(max_tokens: int = SHORT, tool: bool = False) -> dict[str, Any]:
    if tool:
        return {
            **BASE,
            "messages": ADD,
            "tools": [ADD_TOOL],
            "tool_choice": FORCE_ADD,
            "max_tokens": TOOL_TOKENS,
        }
    return {**BASE, "messages": SEA, "max_tokens": max_tokens}


def ollama_chat(max_tokens: int = SHORT) -> dict[str, Any]:
    return {"model": "default", "messages": SEA, "stream": True, "options": {"num_predict": max_tokens}}


def anthropic_chat(max_tokens: int = SHORT) -> dict[str, Any]:
    return {"model": "default", "messages": SEA, "max_tokens": max_tokens, "stream": True}


def job_headers(sent: Sent) -> dict[str, str]:
    """What reads a job back: its creator's token (the drill's admin token reads any job as well)."""
    return {"X-Failsoft-Job-Token": sent.token} if sent.token else {}


async def stream(
    http: httpx.AsyncClient,
    sent: Sent,
    path: str,
    body: dict[str, Any],
    reader: Reader,
    *,
    headers: dict[str, str] | None = None,
    leave: Callable[[Sent, int], bool] | None = None,
) -> Sent:
    """POST a streamed request and read it line by line with `reader`; `leave(sent, lines)` true closes
    the connection there (a client that goes away mid-stream)."""
    try:
        async with http.stream("POST", path, json=body, headers=headers) as response:
            sent.status = response.status_code
            sent.headers_seen(response.headers)
            if response.status_code >= 400:
                error_of(sent, response.status_code, await response.aread())
                return sent
            lines = 0
            async for line in response.aiter_lines():
                reader(sent, line)
                lines += 1
                if sent.outcome is not None:
                    break  # an error event ends the answer
                if leave is not None and sent.ends == 0 and leave(sent, lines):
                    sent.outcome = "left"
                    return sent
    except httpx.HTTPError as error:
        sent.outcome, sent.detail = "lost", repr(error)[:200]
    sent.ended_stream()
    return sent


async def openai_stream(http: httpx.AsyncClient, tool: bool = False) -> list[Sent]:
    """A chat stream; with `tool`, a forced tool call under an Idempotency-Key, retried once under the same
    key when it failed after its call reached the client (that retry must not run the tool again)."""
    sent = Sent("openai_tool_stream" if tool else "openai_stream")
    body = {**openai_chat(tool=tool), "stream": True}
    headers = {"Idempotency-Key": f"chaos-{uuid.uuid4().hex}"} if tool else None
    sent.key = (headers or {}).get("Idempotency-Key", "")
    await stream(http, sent, "/v1/chat/completions", body, read_openai, headers=headers)
    if not (tool and sent.outcome == "error" and sent.tool_at is not None):
        return [sent]
    retry = Sent("openai_tool_retry", key=sent.key)
    await stream(http, retry, "/v1/chat/completions", body, read_openai, headers=headers)
    return [sent, retry]


async def openai_tool(http: httpx.AsyncClient) -> list[Sent]:
    """A whole (non-streamed) forced tool call."""
    sent = Sent("openai_tool")
    response = await _post_whole(http, sent, "/v1/chat/completions", openai_chat(tool=True))
    if response is None:
        return [sent]
    plain_answer(sent, ((response.json().get("choices") or [{}])[0]).get("message") or {})
    return [sent]


async def _post_whole(
    http: httpx.AsyncClient, sent: Sent, path: str, body: dict[str, Any]
) -> httpx.Response | None:
    """POST a non-streamed request; the successful response, or None once `sent` says why there is none
    (a transport error or an HTTP error answer)."""
    try:
        response = await http.post(path, json=body)
    except httpx.HTTPError as error:
        sent.outcome, sent.detail = "lost", repr(error)[:200]
        return None
    sent.status = response.status_code
    sent.headers_seen(response.headers)
    if response.status_code >= 400:
        error_of(sent, response.status_code, response.content)
        return None
    return response


async def ollama_stream(http: httpx.AsyncClient) -> list[Sent]:
    return [await stream(http, Sent("ollama_stream"), "/api/chat", ollama_chat(), read_ollama)]


async def anthropic_stream(http: httpx.AsyncClient) -> list[Sent]:
    sent = Sent("anthropic_stream")
    return [
        await stream(http, sent, "/v1/messages", anthropic_chat(), read_anthropic, headers=ANTHROPIC_HEADERS)
    ]


async def _submit(http: httpx.AsyncClient, body: dict[str, Any], key: str) -> httpx.Response:
    return await http.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})


async def background_job(http: httpx.AsyncClient, timeout: float) -> list[Sent]:
    """`POST /v1/jobs` twice at once under one Idempotency-Key (a client retrying), polled to its end, then
    once more under the key: every answer must name the one job (`Sent.key` groups them)."""
    key = f"chaos-job-{uuid.uuid4().hex}"
    body = {**openai_chat()}
    sent, twin = Sent("job", key=key), Sent("job_retry", key=key, replay=True)
    try:
        first, second = await asyncio.gather(_submit(http, body, key), _submit(http, body, key))
    except httpx.HTTPError as error:
        sent.outcome, sent.detail = "lost", repr(error)[:200]
        return [sent]
    for record, response in ((sent, first), (twin, second)):
        record.status = response.status_code
        if response.status_code >= 400:
            error_of(record, response.status_code, response.content)
        else:
            record.job_id, record.token = str(response.json().get("id") or ""), _token(response)
    if sent.outcome is None:
        await _poll(http, sent, timeout)
    twin.outcome = twin.outcome or sent.outcome
    replay = Sent("job_retry", key=key, replay=True)
    if sent.outcome == "completed":
        try:
            again = await _submit(http, body, key)
        except httpx.HTTPError as error:
            replay.outcome, replay.detail = "lost", repr(error)[:200]
        else:
            replay.status = again.status_code
            if again.status_code >= 400:
                error_of(replay, again.status_code, again.content)
            else:
                replay.job_id, replay.token = str(again.json().get("id") or ""), _token(again)
                replay.outcome = "completed"
        return [sent, twin, replay]
    return [sent, twin]


def _token(response: httpx.Response) -> str:
    return str(response.headers.get("x-failsoft-job-token") or response.json().get("token") or "")


async def _poll(http: httpx.AsyncClient, sent: Sent, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            response = await http.get(f"/v1/jobs/{sent.job_id}", headers=job_headers(sent))
        except httpx.HTTPError as error:
            sent.detail = repr(error)[:200]
            await asyncio.sleep(JOB_POLL)
            continue
        record = response.json() if response.status_code == 200 else {}
        state = record.get("state")
        if state in FINAL_JOB_STATES:
            if state == "completed":
                result = record.get("result") or {}
                plain_answer(sent, ((result.get("choices") or [{}])[0]).get("message") or {})
            else:
                reason = record.get("error") or {}
                sent.outcome, sent.code = "error", str(reason.get("code") or state)
                sent.detail = str(reason.get("message") or "")[:200]
            return
        await asyncio.sleep(JOB_POLL)
    sent.outcome, sent.detail = "lost", f"job {sent.job_id} did not end within {timeout:.0f}s"


async def embedding(http: httpx.AsyncClient) -> list[Sent]:
    sent = Sent("embedding")
    texts = ["The sea is blue.", "A violin has four strings."]
    response = await _post_whole(http, sent, "/v1/embeddings", {"model": "default", "input": texts})
    if response is None:
        return [sent]
    vectors = [item.get("embedding") for item in response.json().get("data") or []]
    sizes = {len(vector) for vector in vectors if isinstance(vector, list)}
    sent.content = len(vectors) == len(texts) and len(sizes) == 1 and 0 not in sizes
    sent.ends = 1
    sent.outcome = "completed" if sent.content else "incomplete"
    return [sent]
