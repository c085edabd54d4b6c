"""The tokenizer helper process: `python -m tray_app.tokenizer.helper --fd N`.

It answers the service's requests (tokenizer.wire) on the socket it inherited as file descriptor N, with a
`TokenizerCounter` per model, loaded on first use. It never touches a GPU: the service starts it with every
GPU hidden (tokenizer.process), and a vocabulary-only load offloads nothing. A short request is answered on
the reading thread at once; a long one on a small pool, so a 4 MiB prompt does not hold the short ones
behind it. When it crashes (a grammar that overflows llama.cpp's parser, a fault in the binding), only the
requests it was reading fail: the service starts it again.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tray_app.tokenizer import wire

INLINE_FRAME_BYTES = 64 * 1024  # a request longer than this is answered on the pool
POOL_THREADS = 2  # llama.cpp's tokenizer releases the GIL: long prompts are counted side by side


class Models:
    """One counter per (model file, chat format), loaded once; a load's failure is kept and said again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, str], Any] = {}

    def get(self, path: str, chat_format: str) -> Any:
        from tray_app.tokenizer.counter import TokenCounter  # the native library: here, not at import

        key = (path, chat_format)
        with self._lock:
            counter = self._counters.get(key)
            if counter is None:
                try:
                    counter = TokenCounter(Path(path), chat_format)
                except (OSError, ValueError) as error:
                    counter = ModelUnreadable(f"cannot read the model's tokenizer from {path}: {error}")
                self._counters[key] = counter
        if isinstance(counter, ModelUnreadable):
            raise counter
        return counter


class ModelUnreadable(Exception):
    pass


def answer(models: Models, request: dict[str, Any]) -> dict[str, Any]:
    """The answer to one request (wire's shapes)."""
    ident = request.get("id")
    try:
        path, chat_format = request["model"]
        counter = models.get(str(path), str(chat_format))
        return {"id": ident, "ok": perform(counter, str(request["op"]), request.get("args") or {})}
    except ModelUnreadable as error:
        return {"id": ident, "error": str(error), "kind": "model"}
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        return {"id": ident, "error": f"{type(error).__name__}: {error}", "kind": "input"}


def perform(counter: Any, op: str, args: dict[str, Any]) -> Any:
    if op == "check":
        problem = counter.grammar_error(args["grammar"]) if args.get("grammar") else None
        if problem is not None:
            return {"tokens": None, "grammar_error": problem}
        body = args["body"]
        tokens = counter.count_chat(body) if args["kind"] == "chat" else counter.count_completion(body)
        return {"tokens": tokens, "grammar_error": None}
    if op == "count_parts":
        extras = args.get("extras")
        framing = None if extras is None else counter.framing_tokens(tuple(args["roles"]), extras)
        return {"framing": framing, "texts": [counter.content_tokens(text) for text in args["texts"]]}
    if op == "count_text":
        return counter.count_text(args["text"], special=args["special"], add_bos=args["add_bos"])
    if op == "count_texts":
        return [counter.count_text(text) for text in args["texts"]]
    if op == "tokenize":
        return counter.tokenize(args["text"])
    if op == "chat_prompt":
        prompt, stops = counter.chat_prompt(args["messages"], args.get("tools"))
        return [prompt, stops]
    if op == "load":
        return True  # the counter is loaded by now
    if op == "crash":
        _crash_for_tests()
    raise ValueError(f"unknown operation {op!r}")


def _crash_for_tests() -> None:
    """Dies as llama.cpp's parser does on an overflowing grammar; only with FAILSOFT_TOKENIZER_FAULTS=1."""
    if os.environ.get("FAILSOFT_TOKENIZER_FAULTS") == "1":
        faulthandler._sigsegv()  # type: ignore[attr-defined]
    raise ValueError("unknown operation 'crash'")


def serve(sock: socket.socket, models: Models) -> None:
    reader = sock.makefile("rb")
    write_lock = threading.Lock()

    def reply(message: dict[str, Any]) -> None:
        data = wire.encode(message)
        with write_lock:
            sock.sendall(data)

    def work(data: bytes) -> None:
        try:
            request = wire.decode(data)
        except (ValueError, wire.WireError) as error:
            reply({"id": None, "error": f"not a request: {error}", "kind": "internal"})
            return
        reply(answer(models, request))

    with ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="count") as pool:
        while True:
            try:
                data = wire.read_frame(reader)
            except (OSError, wire.WireError):
                return
            if data is None:
                return  # the service closed its end: it stopped, so do we
            if len(data) <= INLINE_FRAME_BYTES:
                work(data)
            else:
                pool.submit(work, data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="failsoft-tokenizer")
    parser.add_argument("--fd", type=int, required=True, help="the socket inherited from the service")
    parser.add_argument("--preload", action="append", default=[], help="PATH::CHAT_FORMAT, loaded at start")
    args = parser.parse_args(argv)
    faulthandler.enable(file=sys.stderr)  # the log file the service gave as stderr
    sock = socket.socket(fileno=args.fd)
    models = Models()
    for spec in args.preload:
        path, _, chat_format = spec.partition("::")
        try:
            models.get(path, chat_format)
        except ModelUnreadable as error:
            print(f"failsoft tokenizer: {error}", file=sys.stderr, flush=True)
    try:
        serve(sock, models)
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
