"""The router's overhead against the same worker, measured side by side (figures printed, not asserted)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.helpers import base_settings
from tests.support.service import ServiceHandle, running_service
from tray_app.bench.byte_proxy import byte_proxy
from tray_app.bench.overhead import measure_overhead

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def svc(module_root: Path) -> Iterator[ServiceHandle]:
    with running_service(module_root, settings=base_settings()) as handle:
        yield handle


def test_overhead_measurement_reports_both_paths(svc: ServiceHandle) -> None:
    worker_url = svc.status()["workers"]["gpu"]["base_url"]
    figures = measure_overhead(
        svc.base_url,
        worker_url,
        rounds=8,
        max_tokens=8,
        headers=svc.worker_headers,
        router_pid=svc.process.pid,
    )
    print("\nrouter overhead:", json.dumps(figures, indent=1))
    for path in ("direct", "router"):
        assert set(figures[path]) == {"p50_ms", "p99_ms", "ttft_p50_ms", "stream_total_p50_ms", "gap_mean_ms"}
        assert figures[path]["p50_ms"] > 0 and figures[path]["ttft_p50_ms"] > 0
        assert figures[path]["stream_total_p50_ms"] >= figures[path]["ttft_p50_ms"]
    assert set(figures["added_ms"]) == set(figures["ratio"]) == set(figures["direct"])
    # Each paired median with its interval: with 8 rounds, the smallest and largest of the differences.
    for key, (low, high) in figures["added_interval_ms"].items():
        assert low <= figures["added_ms"][key] <= high
    # The router process did the routing work: it used CPU time for the routed requests.
    assert figures["router_cpu_ms_per_request"] > 0


def test_the_byte_proxy_passes_a_workers_answers_through_unchanged(svc: ServiceHandle) -> None:
    """The bench's floor: a byte-for-byte proxy in front of the real worker answers what the worker does."""
    worker_url = svc.status()["workers"]["gpu"]["base_url"]
    body = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0, "seed": 1}
    direct = httpx.post(
        worker_url + "/v1/chat/completions", json=body, headers=svc.worker_headers, timeout=60
    )
    with byte_proxy(int(worker_url.rsplit(":", 1)[1])) as proxy_url:
        proxied = httpx.post(
            proxy_url + "/v1/chat/completions", json=body, headers=svc.worker_headers, timeout=60
        )
        streamed = httpx.post(
            proxy_url + "/v1/chat/completions", json={**body, "stream": True}, headers=svc.worker_headers
        )
    assert proxied.status_code == direct.status_code == 200
    answer = proxied.json()["choices"][0]["message"]["content"]
    assert answer == direct.json()["choices"][0]["message"]["content"]
    assert streamed.text.rstrip().endswith("data: [DONE]")
