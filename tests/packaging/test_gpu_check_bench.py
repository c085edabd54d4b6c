"""The GPU check's bench phase without a GPU: the not-streamed rounds against a local server that answers as
llama-server does (one JSON body with the usage), paired as `failsoft bench` pairs its streamed ones, and the
failover pause's prompt sizes cut to one GPU slot."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))

import gpu_check_bench  # noqa: E402

from tray_app.bench.throughput import Target  # noqa: E402


class _Answers(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, object]]] = []

    def do_POST(self) -> None:  # http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Answers.seen.append(body)
        time.sleep(0.01)
        tokens = int(body["max_tokens"])
        data = json.dumps({"choices": [{"message": {"content": "x " * tokens}}],
                           "usage": {"prompt_tokens": 9, "completion_tokens": tokens}}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # http.server's name
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_not_streamed_rounds_are_paired_routed_against_direct(server: str) -> None:
    _Answers.seen.clear()
    levels = asyncio.run(
        gpu_check_bench.plain_levels(Target(server, {}), Target(server, {}), (1, 3), 2, 2, 5)
    )
    assert [level["clients"] for level in levels] == [1, 3]
    for level in levels:
        assert level["direct_tokens_per_second"] > 0 and level["router_tokens_per_second"] > 0
        assert level["ratio"] is not None and level["direct_answer_p50_ms"] >= 10
        assert not any("ttft" in key for key in level)  # not streamed: the whole answer's time
    # 2 rounds x 2 sides x (1 + 3 clients) x 2 requests, every one not streamed with the prompt cache off.
    assert len(_Answers.seen) == 32
    assert all(body["stream"] is False and body["cache_prompt"] is False for body in _Answers.seen)


def test_pause_sizes_fit_one_gpu_slot() -> None:
    assert gpu_check_bench.pause_sizes(8192) == [100, 1000, 4000]
    cut = gpu_check_bench.pause_sizes(2048)
    assert cut[:2] == [100, 1000] and cut[2] < 2048 - gpu_check_bench.ANSWER_TOKENS
    assert min(gpu_check_bench.pause_sizes(100)) >= 64


def test_bench_lines_name_each_figure() -> None:
    entry = {
        "throughput": {
            "streamed": [{"clients": 16, "direct_tokens_per_second": 900.0, "router_tokens_per_second": 880.0,
                          "ratio": 0.978}],
            "not_streamed": [],
        },
        "failover_pause": [{"prompt_tokens_asked": 4000, "mirror": False, "pause_ms": 812.5}],
    }  # fmt: skip
    lines = gpu_check_bench.bench_lines(entry)
    assert lines == [
        "streamed 16 clients: direct 900.0 tok/s, router 880.0 tok/s, ratio 0.978",
        "pause 4000 tokens mirror off: 812.5 ms",
    ]
