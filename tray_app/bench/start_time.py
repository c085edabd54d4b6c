"""`failsoft bench --start`: how soon a started service answers, beside `llama-server` alone.

A restart is only as good as it is quick: after a crash the tray (or systemd) starts the service again and
its clients wait meanwhile. Measured from the moment the process is started to the first chat answered
(HTTP 200), polling every 20 ms: `failsoft serve` with a new data folder (cold: nothing cached) and again on
the same folder (warm: what a restart after a crash finds), and `llama-server` on the same model and
context alone (its `/completion`, one token), which no service on top of it can beat.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import tomli_w

from tray_app.engine import binary
from tray_app.engine.argv import amx_in_a_virtual_machine
from tray_app.host.launch import spawn_serve, stop_process_tree
from tray_app.supervisor.ports import free_port

POLL_SECONDS = 0.02
GIVE_UP_SECONDS = 120.0
CHAT = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}


def first_answer(url: str, body: dict[str, Any], started: float, process: subprocess.Popen[bytes]) -> float:
    """Seconds from `started` to the first 200 from `url` (RuntimeError if the process ends first)."""
    with httpx.Client(timeout=GIVE_UP_SECONDS) as client:
        while time.monotonic() - started < GIVE_UP_SECONDS:
            if process.poll() is not None:
                raise RuntimeError(f"it exited with status {process.returncode} before answering")
            try:
                if client.post(url, json=body).status_code == 200:
                    return time.monotonic() - started
            except httpx.TransportError:
                pass
            time.sleep(POLL_SECONDS)
    raise RuntimeError(f"no answer in {GIVE_UP_SECONDS:.0f} s")


def service_start(settings: dict[str, Any], data: Path, root: Path) -> tuple[float, str]:
    """One `failsoft serve` start on data folder `data`: seconds to its first chat answer, and the worker
    that answered it."""
    root.mkdir(parents=True, exist_ok=True)
    config_path = root / "config.toml"
    config_path.write_text(tomli_w.dumps(settings), encoding="utf-8")
    started = time.monotonic()
    serve = spawn_serve(root, config_path, data_dir=data)
    try:
        seconds = first_answer(f"{serve.base_url}/v1/chat/completions", CHAT, started, serve.process)
        answer = httpx.post(f"{serve.base_url}/v1/chat/completions", json=CHAT, timeout=60)
        return seconds, answer.headers.get("x-failsoft-worker", "")
    finally:
        stop_process_tree(serve.process)


def engine_start(model: Path, n_ctx: int, engine: Path) -> float:
    """`llama-server` alone on `model`: seconds to its first one-token completion."""
    port = free_port()
    argv = [str(engine), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", str(n_ctx)]
    if amx_in_a_virtual_machine():
        argv.append("--no-repack")  # as the service's workers start here (engine.argv)
    started = time.monotonic()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        body = {"prompt": "Hi", "n_predict": 1}
        return first_answer(f"http://127.0.0.1:{port}/completion", body, started, process)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def start_figures(
    settings: dict[str, Any], model: Path, n_ctx: int, rounds: int, progress: Callable[[str], None]
) -> dict[str, Any]:
    """`rounds` of each: a cold service start, a warm one, and llama-server alone; medians and each run."""
    engine = binary.find(str(settings.get("engine", {}).get("llama_server") or "")).path
    runs: dict[str, list[float]] = {"cold": [], "warm": [], "llama_server": []}
    answered_by: list[str] = []
    with tempfile.TemporaryDirectory(prefix="failsoft-start-") as tmp:
        for round_number in range(rounds):
            progress(
                f"start {round_number + 1}/{rounds}: a new data folder, the same again, llama-server alone"
            )
            data = Path(tmp) / f"data-{round_number}"
            for kind in ("cold", "warm"):
                seconds, worker = service_start(settings, data, Path(tmp) / f"{kind}-{round_number}")
                runs[kind].append(round(seconds, 3))
                answered_by.append(worker)
            runs["llama_server"].append(round(engine_start(model, n_ctx, engine), 3))
    medians = {kind: round(statistics.median(values), 3) for kind, values in runs.items()}
    return {
        "median_seconds": medians,
        "runs": runs,
        "answered_by": sorted(set(answered_by)),
        "warm_over_llama_server": round(medians["warm"] / medians["llama_server"], 2),
    }


def start_lines(figures: dict[str, Any]) -> str:
    medians = figures["median_seconds"]
    return "\n".join(
        [
            "Start to first answer (median seconds; process start to the first chat answered):",
            f"  failsoft serve, new data folder:  {medians['cold']:.2f}",
            f"  failsoft serve, same data folder: {medians['warm']:.2f}  "
            f"({figures['warm_over_llama_server']}x llama-server alone)",
            f"  llama-server alone:               {medians['llama_server']:.2f}",
            f"  answered by: {', '.join(figures['answered_by'])}",
            f"  runs: {json.dumps(figures['runs'])}",
        ]
    )
