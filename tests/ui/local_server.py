"""A small HTTP server on loopback that records what the tray sends and answers from a table: for checking
the tray's calls (path, body, key) without starting the real service."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: Any  # parsed JSON, or None


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


class LocalService:
    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.answers: dict[tuple[str, str], Answer] = {}
        self._lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                service._handle(self, "GET")

            def do_POST(self) -> None:
                service._handle(self, "POST")

            def log_message(self, format: str, *args: Any) -> None:  # quiet test output
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def answer(
        self, method: str, path: str, status: int, body: Any, headers: dict[str, str] | None = None
    ) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.answers[(method, path)] = Answer(
            status, data, {"Content-Type": "application/json", **(headers or {})}
        )

    def calls(self, method: str, path: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if (r.method, r.path) == (method, path)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body = json.loads(raw) if raw.strip() else None
        headers = {name.lower(): value for name, value in handler.headers.items()}
        with self._lock:
            self.requests.append(Recorded(method, handler.path, headers, body))
        answer = self.answers.get((method, handler.path)) or Answer(
            404, json.dumps({"error": {"message": "not found", "code": "not_found"}}).encode()
        )
        handler.send_response(answer.status)
        for name, value in answer.headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(answer.body)))
        handler.end_headers()
        handler.wfile.write(answer.body)
