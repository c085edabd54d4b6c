"""Other programs on a port Failsoft wants: a plain HTTP server that answers every GET with one status, and
a listener that accepts connections and never answers."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """A loopback HTTP server for `handler` on a free port, in a thread, for the block; yields the port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def http_server(status: int, body: bytes = b"<html>not Failsoft</html>") -> Iterator[int]:
    """Yields the port of a loopback HTTP server answering every GET with `status` and `body`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    with serving(Handler) as port:
        yield port


@contextlib.contextmanager
def silent_listener() -> Iterator[int]:
    """Yields the port of a loopback socket that listens (the kernel accepts) and never says a word."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield int(listener.getsockname()[1])
