"""`failsoft bench` with very few rounds on a simulated GPU: one run gives every section, with numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.service import running_service
from tests.support.waits import wait_until
from tray_app.bench import report
from tray_app.engine.argv import amx_in_a_virtual_machine
from tray_app.engine.binary import bundled_server
from tray_app.host.launch import free_port, stop_process_tree

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def test_bench_json_has_every_section_with_numbers(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "FAILSOFT_DATA_DIR": str(tmp_path / "data"),
        "FAILSOFT_LOG_DIR": str(tmp_path / "logs"),
    }
    command = [
        sys.executable,
        "-m",
        "tray_app",
        "bench",
        "--simulate-vram",
        "4GiB",
        "--rounds",
        "3",
        "--clients",
        "1,4",
        "--tokens",
        "8",
        "--json",
    ]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400, check=False)
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(f"the bench did not end in 400 s; it printed:\n{timeout.stderr!r}")
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout)

    for name, tokens, rounds in (("router_fixed_cost", 1, 15), ("router_overhead", 8, 3)):
        router = results[name]
        assert (router["max_tokens"], router["rounds"]) == (tokens, rounds)
        for side in ("direct", "router", "added_ms", "ratio"):
            keys = ("p50_ms", "p99_ms", "ttft_p50_ms", "stream_total_p50_ms", "gap_mean_ms")
            assert all(number(router[side][key]) for key in keys)
        assert router["direct"]["p50_ms"] > 0 and router["router"]["p50_ms"] > 0
        assert number(router["router_own_ms"]) and router["router_cpu_ms_per_request"] >= 0
        # The router's own clock on each routed stream's way to its first token: at most one figure per
        # round (a first token that found the previous write still queued is not timed: the wait is the
        # client's, not the router's).
        own = router["own_ms"]
        assert 0 < own["requests"] <= rounds and own["to_worker_ms"] > 0 and own["to_client_ms"] > 0
        assert own["total_ms"] < router["router"]["ttft_p50_ms"]
    # One-token rounds are five times as many: 15 pairs give an interval, 3 are too few for one.
    low, high = results["router_fixed_cost"]["added_interval_ms"]["ttft_p50_ms"]
    assert low <= results["router_fixed_cost"]["added_ms"]["ttft_p50_ms"] <= high
    assert results["router_overhead"]["added_interval_ms"]["ttft_p50_ms"] is None
    # CPU time comes in clock ticks (10 ms): 6 short requests may round to none, so only its presence is
    # checked here; `failsoft bench` with its default rounds measures it.
    assert results["router_overhead"]["direct"]["gap_mean_ms"] > 0

    throughput = results["throughput"]
    assert [row["clients"] for row in throughput["levels"]] == [1, 4] and throughput["max_tokens"] == 8
    for row in throughput["levels"]:
        assert row["direct_tokens_per_second"] > 0 and row["router_tokens_per_second"] > 0
        assert number(row["ratio"]) and number(row["router_ttft_p50_ms"]) and number(row["ttft_added_p50_ms"])
        assert row["ratio_interval"] is None  # 2 rounds: too few for a 95 % interval
    # The byte-for-byte proxy's figures: the floor of any extra hop, measured beside the router's.
    assert all(number(value) for value in results["byte_proxy"]["added_ms"].values())
    assert results["byte_proxy"]["router"]["ttft_p50_ms"] > 0

    failover = results["failover_overhead"]
    assert failover["measured"] >= 1
    for key in ("failure_to_first_cpu_token_ms", "cpu_ttft_ms", "overhead_ms", "ratio"):
        assert number(failover[key]), failover
    assert failover["failure_to_first_cpu_token_ms"] > 0

    workers = results["profiles"]["workers"]
    assert set(workers) == {"cpu", "gpu_simulated"}
    for figures in workers.values():
        assert figures["tokens_per_second"] > 0 and figures["ttft_ms"] > 0

    for role in ("gpu", "cpu"):
        rows = results["planner_accuracy"][role]
        for name in ("weights", "kv", "compute"):
            assert number(rows[name]["ratio"]) and rows[name]["reported_bytes"] > 0, rows
        # The KV cache is computed exactly (the planner's formula is llama.cpp's).
        assert rows["kv"]["ratio"] == 1.0

    printed = report.text(results)  # what `failsoft bench` prints without --json
    assert "(15 rounds, 1 token, interleaved" in printed and "(3 rounds, 8 tokens, interleaved" in printed
    assert printed.count("streamed inter-chunk gap") == 1  # one token has no gap to show
    own_counts = (results[name]["own_ms"]["requests"] for name in ("router_fixed_cost", "router_overhead"))
    assert all(f"(its own clock, p50 of {count} streams:" in printed for count in own_counts)
    assert "throughput: concurrent clients, each 2 requests of 8 tokens" in printed

    (saved,) = (tmp_path / "data" / "reports").glob("bench-*.json")
    assert json.loads(saved.read_text()) == results


def test_bench_against_another_server_measures_both_sides(tmp_path: Path, model_path: Path) -> None:
    """`--against` with a plain llama-server as the other server and a running Failsoft as `--url`."""
    binary = bundled_server()
    assert binary is not None
    port = free_port()
    argv = [str(binary), "--model", str(model_path), "--host", "127.0.0.1", "--port", str(port)]
    if amx_in_a_virtual_machine():
        argv.append("--no-repack")  # as the service's own workers start here (engine.argv)
    other = subprocess.Popen(
        [*argv, "--ctx-size", "2048", "--parallel", "2", "--no-webui"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with running_service(tmp_path / "service") as svc:
            wait_until(lambda: _healthy(port), what="the other llama-server")
            env = {**os.environ, "FAILSOFT_DATA_DIR": str(tmp_path / "data")}
            command = [sys.executable, "-m", "tray_app", "bench", "--against", f"http://127.0.0.1:{port}/v1"]
            command += [
                "--url",
                svc.base_url,
                "--clients",
                "1,2",
                "--rounds",
                "12",
                "--tokens",
                "8",
                "--json",
            ]
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    finally:
        stop_process_tree(other)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout)
    assert (results["against"], results["failsoft"]) == (f"http://127.0.0.1:{port}", svc.base_url)
    assert (results["rounds"], results["requests_per_client"], results["max_tokens"]) == (2, 4, 8)
    assert [row["clients"] for row in results["levels"]] == [1, 2]
    for row in results["levels"]:
        assert row["other_tokens_per_second"] > 0 and row["failsoft_tokens_per_second"] > 0
        assert (
            number(row["ratio"]) and number(row["other_ttft_p50_ms"]) and number(row["failsoft_ttft_p50_ms"])
        )
    (saved,) = (tmp_path / "data" / "reports").glob("bench-against-*.json")
    assert json.loads(saved.read_text()) == results
    # Nothing listening there: a clear error, no traceback.
    refused = subprocess.run(
        [*command[:5], f"http://127.0.0.1:{free_port()}", *command[6:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode == 2 and refused.stderr.startswith("failsoft bench: ")
    assert "Traceback" not in refused.stderr


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
