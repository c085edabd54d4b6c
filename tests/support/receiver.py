"""A local stand-in for ntfy and for a webhook: a loopback HTTP server that records every POST (path,
headers, JSON body) and answers 200, or 500 on paths under /broken (a channel that fails)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.http_server import serving


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Receiver:
    port: int
    posts: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [post for post in self.posts if post.path == path]


@contextlib.contextmanager
def receiver() -> Iterator[Receiver]:
    record = Receiver(0)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
            with record.lock:
                record.posts.append(Received(self.path, dict(self.headers.items()), body))
            status = 500 if self.path.startswith("/broken") else 200
            answer = b'{"error":"down for the test"}' if status == 500 else b'{"id":"ok"}'
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            return

    with serving(Handler) as port:
        record.port = port
        yield record
