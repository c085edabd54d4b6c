"""A small stand-in for llama-server, for the fast test tier (like llama-swap's `simple-responder`): it
answers `--version`, `--help` and `--list-devices` the way llama-server does, then serves `/health`, the
warm-up `/completion`, `/v1/chat/completions` and `/v1/completions` (streamed as llama-server streams),
`/v1/embeddings`, `/slots` and `/metrics` on the `--port` it is given, with no model behind it.

How it misbehaves is chosen per process by environment variables, so that tests of the supervisor and the
router can script every way a worker fails without loading a model:

    FAKE_LLAMA_TOKEN_DELAY     seconds between streamed tokens (default 0.005)
    FAKE_LLAMA_LOAD_SECONDS    answer /health 503 "Loading model" this long after start
    FAKE_LLAMA_IGNORE_SIGTERM  1: keep running on SIGTERM (the supervisor must SIGKILL it)
    FAKE_LLAMA_DIE_AFTER       seconds after start to end the process with FAKE_LLAMA_DIE_SIGNAL (ABRT)
    FAKE_LLAMA_ERROR_AFTER     send llama-server's decode failure ("Compute error.") after this many tokens
    FAKE_LLAMA_HANG_AFTER      stop sending (the process stays up) after this many tokens
    FAKE_LLAMA_WORD_BYTES      pad each streamed token's text to this many bytes (a flood for slow readers)
    FAKE_LLAMA_FAULTY          which process the three above apply to: gpu (started with layers on the
                               GPU), cpu, or all (default)
    FAKE_LLAMA_GPU             a device name (e.g. Vulkan0): list it in --list-devices and, when started
                               with layers on the GPU, print llama.cpp's load lines for `placed` layers
    FAKE_LLAMA_PLACED          of 31 layers, how many land on that device (default all 31)

Usage: make an executable that runs `python fake_llama_server.py "$@"` (tests/support/fake_worker.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

VERSION = "version: 0.5.0-dev (build 1, commit fake000)"
FLAGS = (
    "--model --alias --host --port --ctx-size --parallel --n-gpu-layers --threads --threads-batch "
    "--threads-http --batch-size --ubatch-size --cache-type-k --cache-type-v --flash-attn --fit "
    "--no-webui --metrics --jinja --load-mode --embeddings --pooling --device --chat-template "
    "--chat-template-file --log-verbosity --no-repack --list-devices --cache-ram"
)
WORDS = ("The", " sea", " is", " wide", " and", " deep", " and", " blue", ".")


def _number(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


STARTED = time.monotonic()
TOKEN_DELAY = _number("FAKE_LLAMA_TOKEN_DELAY", 0.005)
LOAD_SECONDS = _number("FAKE_LLAMA_LOAD_SECONDS", 0.0)
ON_GPU = "--n-gpu-layers" in sys.argv and sys.argv[sys.argv.index("--n-gpu-layers") + 1] != "0"
FAULTY = os.environ.get("FAKE_LLAMA_FAULTY", "all") in ("all", "gpu" if ON_GPU else "cpu")
ERROR_AFTER = int(_number("FAKE_LLAMA_ERROR_AFTER", -1)) if FAULTY else -1
HANG_AFTER = int(_number("FAKE_LLAMA_HANG_AFTER", -1)) if FAULTY else -1
WORD_BYTES = int(_number("FAKE_LLAMA_WORD_BYTES", 0))


def _chunk(kind: str, text: str | None, finish: str | None = None, role: bool = False) -> dict[str, Any]:
    if kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": None} if role else {}
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake",
                "choices": [choice]}  # fmt: skip
    choice = {"index": 0, "text": text or "", "finish_reason": finish}
    return {
        "id": "cmpl-fake",
        "object": "text_completion",
        "created": 1,
        "model": "fake",
        "choices": [choice],
    }


def _event(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj)
    return f"data: {data}\n\n".encode()


async def _write_chunked(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


async def _stream(writer: asyncio.StreamWriter, kind: str, body: dict[str, Any]) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
        b"connection: close\r\n\r\n"
    )
    tokens = int(body.get("max_tokens") or body.get("n_predict") or 16)
    if kind == "chat":
        await _write_chunked(writer, _event(_chunk(kind, None, role=True)))
    for index in range(tokens):
        if index == ERROR_AFTER:
            error = {"error": {"code": 500, "message": "Compute error.", "type": "server_error"}}
            await _write_chunked(writer, _event(error))
            break
        if index == HANG_AFTER:
            await asyncio.sleep(3600)
        await asyncio.sleep(TOKEN_DELAY)
        await _write_chunked(writer, _event(_chunk(kind, WORDS[index % len(WORDS)].ljust(WORD_BYTES, "x"))))
    else:
        finish = _chunk(kind, None if kind == "chat" else "", finish="length")
        usage = {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens}
        await _write_chunked(writer, _event({**finish, "usage": usage}))
        await _write_chunked(writer, _event("[DONE]"))
    writer.write(b"0\r\n\r\n")
    await writer.drain()


def _json(status: int, obj: Any) -> bytes:
    data = json.dumps(obj).encode()
    reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}.get(status, "Error")
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
    ).encode() + data


async def _answer(method: str, path: str, body: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
    """Answer one request; False when the connection must close (after a stream, as llama-server does)."""
    if time.monotonic() - STARTED < LOAD_SECONDS:
        error = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
        writer.write(_json(503, error))
        return True
    if path in ("/health", "/v1/health"):
        writer.write(_json(200, {"status": "ok"}))
    elif path == "/completion":
        writer.write(_json(200, {"content": "Hi", "tokens_predicted": 1}))
    elif path in ("/v1/chat/completions", "/v1/completions") and method == "POST":
        await _stream(writer, "chat" if "chat" in path else "completion", body)
        return False
    elif path == "/v1/embeddings":
        inputs = body.get("input")
        count = len(inputs) if isinstance(inputs, list) else 1
        data = [{"object": "embedding", "index": i, "embedding": [0.5, 0.25, float(i)]} for i in range(count)]
        usage = {"prompt_tokens": count, "total_tokens": count}
        writer.write(_json(200, {"object": "list", "model": "fake", "data": data, "usage": usage}))
    elif path == "/slots":
        writer.write(_json(200, [{"id": 0, "n_ctx": 512, "is_processing": False}]))
    elif path == "/metrics":
        writer.write(_json(200, {}))
    else:
        writer.write(
            _json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})
        )
    return True


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            first, *lines = head.decode("latin-1").split("\r\n")
            method, path, _ = first.split(" ", 2)
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)
            }
            raw = await reader.readexactly(int(headers.get("content-length", "0") or 0))
            body = json.loads(raw) if raw else {}
            keep = await _answer(method, path.split("?")[0], body, writer)
            await writer.drain()
            if not keep:
                break
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


GPU = os.environ.get("FAKE_LLAMA_GPU", "")
LAYERS = 31


def _load_lines() -> list[str]:
    """What llama.cpp's load_tensors prints about where the layers and weights went."""
    if not (GPU and ON_GPU):
        return ["load_tensors:   CPU_Mapped model buffer size =    92.00 MiB"]
    placed = int(_number("FAKE_LLAMA_PLACED", LAYERS))
    return [
        f"load_tensors: offloading {min(placed, LAYERS - 1)} repeating layers to GPU",
        f"load_tensors: offloaded {placed}/{LAYERS} layers to GPU",
        f"load_tensors: {GPU:>12} model buffer size =    {3.0 * placed:.2f} MiB",
        "load_tensors:   CPU_Mapped model buffer size =    21.79 MiB",
    ]


async def _main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port)
    for line in _load_lines():
        print(line, file=sys.stderr, flush=True)
    print(f"load_tensors: fake model loaded, listening on 127.0.0.1:{port}", file=sys.stderr, flush=True)
    print("srv  main: model loaded", file=sys.stderr, flush=True)
    die_after = _number("FAKE_LLAMA_DIE_AFTER", -1.0) if FAULTY else -1.0
    if die_after >= 0:
        dying = getattr(signal, f"SIG{os.environ.get('FAKE_LLAMA_DIE_SIGNAL', 'ABRT')}")
        asyncio.get_running_loop().call_later(die_after, os.kill, os.getpid(), dying)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if "--version" in argv:
        print(VERSION, file=sys.stderr)
        return 0
    if "--help" in argv:
        print("\n".join(f"{flag} N    (fake)" for flag in FLAGS.split()))
        return 0
    if "--list-devices" in argv:
        device = f"{GPU}: fake GPU (4096 MiB, 4000 MiB free)" if GPU else "(none)"
        print(f"Available devices:\n  {device}")
        return 0
    if os.environ.get("FAKE_LLAMA_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    port = int(argv[argv.index("--port") + 1])
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
