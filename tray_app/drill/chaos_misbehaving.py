"""The misbehaving part of the chaos mix: clients that leave mid-stream (each dialect in turn), slow readers
(a raw socket with a tiny receive buffer that stops reading: past the router's stall limit, or briefly and
then gone), non-readers (the same socket, which reads nothing and stays until the service ends its job:
keep-alive comments must not keep it, review F1) and requests carrying llama-server's own fields (each must
get 400 `unsupported_field`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from itertools import count
from typing import Any
from urllib.parse import urlsplit

import httpx

from tray_app.contract.vocabulary import UNFINISHED_JOB_STATES
from tray_app.drill.bodies import STORY
from tray_app.drill.chaos_records import (
    JOB_HEADER,
    TOKEN_HEADER,
    Sent,
    error_of,
    read_anthropic,
    read_ollama,
    read_openai,
)
from tray_app.drill.chaos_requests import (
    ANTHROPIC_HEADERS,
    anthropic_chat,
    job_headers,
    ollama_chat,
    openai_chat,
    stream,
)

LEAVE_AFTER_LINES = 3  # a few pieces of the answer have arrived when the client goes
LONG = 64  # tokens: long enough that the client leaves before the end
# A slow reader's answer at most (its slot may take fewer): about 500 KB with its log probabilities, several
# times what the buffers between the router and a reader that announces a small segment size hold (about
# 110 KB, see `_socket`), and short enough that one on the CPU worker does not hold its slot for minutes.
SLOW_TOKENS = 240
RECEIVE_BUFFER = 2048
SEGMENT = 536
BRIEF_PAUSE = 3.0  # a slow reader that goes away reads nothing this long first
DRAIN = 15.0  # seconds a non-reader gives the rest of its stream once the service ended its job
JOB_POLL = 0.5
# Engine-internal fields, each on a route that takes OpenAI's bodies.
ENGINE_FIELDS: list[tuple[str, str, dict[str, Any]]] = [
    ("/v1/chat/completions", "id_slot", {"id_slot": 0}),
    ("/v1/chat/completions", "n_cmpl", {"n_cmpl": 2, "stream": True}),
    ("/v1/completions", "n_predict", {"n_predict": 500}),
    ("/v1/jobs", "n_probs", {"n_probs": 3}),
]

_leaver_turns = count()
_field_turns = count()


def _leave_now(sent: Sent, lines: int) -> bool:
    return sent.content and lines >= LEAVE_AFTER_LINES


async def leaver(http: httpx.AsyncClient) -> list[Sent]:
    """A client of each dialect in turn that goes away after the first pieces of its answer."""
    turn = next(_leaver_turns) % 3
    if turn == 0:
        body = {**openai_chat(LONG), "stream": True}
        sent = await stream(
            http, Sent("openai_leaver"), "/v1/chat/completions", body, read_openai, leave=_leave_now
        )
    elif turn == 1:
        sent = await stream(
            http, Sent("ollama_leaver"), "/api/chat", ollama_chat(LONG), read_ollama, leave=_leave_now
        )
    else:
        sent = await stream(
            http,
            Sent("anthropic_leaver"),
            "/v1/messages",
            anthropic_chat(LONG),
            read_anthropic,
            headers=ANTHROPIC_HEADERS,
            leave=_leave_now,
        )
    return [sent]


async def engine_field(http: httpx.AsyncClient) -> list[Sent]:
    """A body carrying one of llama-server's own fields: 400 `unsupported_field` naming it, or a problem."""
    path, name, extra = ENGINE_FIELDS[next(_field_turns) % len(ENGINE_FIELDS)]
    base = (
        {"model": "default", "prompt": "The tide", "max_tokens": 4}
        if "completions" in path and "chat" not in path
        else openai_chat(4)
    )
    sent = Sent("engine_field")
    try:
        async with http.stream("POST", path, json={**base, **extra}) as response:
            sent.status = response.status_code
            sent.headers_seen(response.headers)
            raw = await response.aread() if response.status_code >= 400 else b""
    except httpx.HTTPError as error:
        sent.outcome, sent.detail = "lost", repr(error)[:200]
        return [sent]
    try:
        refusal = json.loads(raw).get("error") or {}
    except (ValueError, AttributeError):
        refusal = {}
    if sent.status == 400 and refusal.get("code") == "unsupported_field" and refusal.get("param") == name:
        sent.outcome, sent.code = "refused", "unsupported_field"
    else:
        sent.outcome = "accepted"
        sent.detail = f"{path} with {name!r} answered {sent.status} {refusal.get('code')!r}"
    return [sent]


def _request_bytes(base_url: str, headers: dict[str, str], body: dict[str, Any]) -> tuple[str, int, bytes]:
    parts = urlsplit(base_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    payload = json.dumps(body).encode()
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        *(f"{name}: {value}" for name, value in headers.items()),
        "",
        "",
    ]
    return host, port, "\r\n".join(lines).encode() + payload


def _read_head(sent: Sent, data: bytes) -> None:
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    with contextlib.suppress(IndexError, ValueError):
        sent.status = int(head[0].split()[1])
    fields = {
        line.split(":", 1)[0].strip().lower(): line.split(":", 1)[1].strip()
        for line in head[1:]
        if ":" in line
    }
    sent.job_id, sent.token = fields.get(JOB_HEADER, ""), fields.get(TOKEN_HEADER, "")


def _socket() -> socket.socket:
    """A client socket that, once it stops reading, holds up the router's write soon: a tiny receive buffer,
    and a small segment size, from which the kernel sizes the server's send buffer on loopback (with the
    default, the 64 KiB MTU's, it takes a few MB first: most of an answer)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, SEGMENT)
    sock.setblocking(False)
    return sock


def _chatty(max_tokens: int) -> dict[str, Any]:
    """A long streamed chat whose log probabilities make each piece about 2 KB: it outgrows every buffer on
    the way to a client that does not read."""
    return {
        **openai_chat(max_tokens),
        "messages": STORY,
        "stream": True,
        "logprobs": True,
        "top_logprobs": 20,
    }


async def slow_reader(
    base_url: str, headers: dict[str, str], hold: float, read_timeout: float, max_tokens: int = SLOW_TOKENS
) -> list[Sent]:
    """A streamed chat from a socket with a tiny receive buffer that reads nothing for `hold` seconds; then
    it reads the rest (`hold` past the stall limit: the router has dropped it by then), or, with a brief
    hold, goes away without reading (a paused tab closed)."""
    leaves = hold <= BRIEF_PAUSE
    sent = Sent("slow_leaver" if leaves else "slow_reader")
    host, port, request = _request_bytes(base_url, headers, _chatty(max_tokens))
    loop = asyncio.get_running_loop()
    sock = _socket()
    data, closed = b"", False
    try:
        await asyncio.wait_for(loop.sock_connect(sock, (host, port)), 10)
        await loop.sock_sendall(sock, request)
        # The head (job id and token) and the first pieces; then it reads nothing.
        data = await asyncio.wait_for(loop.sock_recv(sock, RECEIVE_BUFFER), read_timeout)
        await asyncio.sleep(hold)
        if leaves:
            sent.outcome = "left"
        else:
            rest, closed = await _drain(loop, sock, read_timeout)
            data += rest
    except (OSError, TimeoutError) as error:
        sent.detail = repr(error)[:200]
    finally:
        sock.close()
    _read_head(sent, data)
    if sent.outcome is None:
        _judge(sent, data, closed, f"neither ended nor dropped within {read_timeout:.0f}s")
    return [sent]


async def non_reader(
    http: httpx.AsyncClient,
    base_url: str,
    headers: dict[str, str],
    read_timeout: float,
    max_tokens: int = SLOW_TOKENS,
) -> list[Sent]:
    """A streamed chat from a socket with a tiny receive buffer that reads the head and then nothing, and
    does not go away: a tab paused for good. Only the service can end it: the router's stall limit drops it
    (`dropped`), keep-alive comments or not. Once the job has ended (read through the mix's own client) it
    reads what is left, so a job that ended another way (an answer that fit the buffers: `completed`, a
    worker's failure: `error`) is judged by its stream. A job still unfinished after `read_timeout` (less
    the time to read the rest) is `lost`: the service kept a client that reads nothing."""
    sent = Sent("non_reader")
    host, port, request = _request_bytes(base_url, headers, _chatty(max_tokens))
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + read_timeout - DRAIN
    sock = _socket()
    data, closed, ended = b"", False, False
    try:
        await asyncio.wait_for(loop.sock_connect(sock, (host, port)), 10)
        await loop.sock_sendall(sock, request)
        data = await asyncio.wait_for(loop.sock_recv(sock, RECEIVE_BUFFER), read_timeout)  # the head
        _read_head(sent, data)
        ended = await _job_ended(http, sent, deadline)
        if ended:
            rest, closed = await _drain(loop, sock, DRAIN)
            data += rest
    except (OSError, TimeoutError) as error:
        sent.detail = repr(error)[:200]
    finally:
        sock.close()
    if sent.job_id and not ended:
        sent.outcome = "lost"
        sent.detail = sent.detail or f"read nothing for {read_timeout - DRAIN:.0f}s and was never dropped"
    else:
        _judge(sent, data, closed, f"its job ended, but its stream did not within {DRAIN:.0f}s")
    return [sent]


async def _job_ended(http: httpx.AsyncClient, sent: Sent, deadline: float) -> bool:
    """Whether the job (none: a refusal, nothing to wait for) ends before `deadline`."""
    while sent.job_id and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = await http.get(f"/v1/jobs/{sent.job_id}", headers=job_headers(sent), timeout=10)
            if response.status_code == 200 and response.json().get("state") not in UNFINISHED_JOB_STATES:
                return True
        await asyncio.sleep(JOB_POLL)
    return not sent.job_id


def _judge(sent: Sent, data: bytes, closed: bool, lost: str) -> None:
    """A raw stream's outcome: a refusal or an error event says why; read to its end: whole; cut short by
    the service (its stall limit): dropped, as it should be; neither: lost."""
    if sent.status >= 400:
        error_of(sent, sent.status, data.split(b"\r\n\r\n", 1)[-1])
        return
    _read_body(sent, data)
    if sent.outcome is None:
        sent.outcome = "completed" if sent.ends else "dropped" if closed and data else "lost"
    if sent.outcome == "lost":
        sent.detail = sent.detail or lost


def _read_body(sent: Sent, data: bytes) -> None:
    """The stream's events as the raw bytes hold them (chunked: each event is a chunk of its own)."""
    for raw in data.split(b"\r\n\r\n", 1)[-1].split(b"\n"):
        with contextlib.suppress(ValueError):
            read_openai(sent, raw.decode("utf-8", errors="replace").strip())


async def _drain(loop: asyncio.AbstractEventLoop, sock: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """What arrives until the answer's end or the server closes the connection (a reset counts as closed);
    and whether either happened within `timeout`."""
    data = b""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            piece = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), left)
        except ConnectionResetError:
            return data, True
        except TimeoutError:
            break
        if not piece or b"data: [DONE]" in data[-64:] + piece:
            return data + piece, True
        data += piece
    return data, False
