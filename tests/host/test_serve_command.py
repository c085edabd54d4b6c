"""`failsoft serve`: the port is taken before anything starts, and the first line names what serves."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.service import free_port, running_service, write_config
from tray_app import config
from tray_app.budget.device import no_gpu
from tray_app.budget.plan_set import PlanSet, plan_from_config
from tray_app.budget.target import PlanTarget
from tray_app.host.bind import listening_socket
from tray_app.host.serve_command import check_bind, devices_line

GIB = 1024**3


@pytest.fixture(scope="module")
def simulated_plans(model_path: Path) -> PlanSet:
    cfg = config.from_dict({"device": {"simulate_vram": "4GiB"}, "model": {"path": str(model_path)}})
    return plan_from_config(cfg)


def test_a_simulated_gpu_says_so(simulated_plans: PlanSet) -> None:
    line = devices_line(simulated_plans, "m.gguf", cpu_enabled=True)
    gpu, cpu = simulated_plans.gpu, simulated_plans.cpu
    assert line == (
        f"model m.gguf; simulated GPU 4.00 GiB [SIMULATED]: n_ctx {gpu.n_ctx} ({gpu.n_ctx_per_seq} per "
        f"sequence, {gpu.n_parallel} parallel); CPU n_ctx {cpu.n_ctx} ({cpu.n_parallel} parallel)"
    )


def test_without_a_gpu_no_gpu_context_is_announced(simulated_plans: PlanSet) -> None:
    reason = "no NVIDIA GPU: NVML Shared Library Not Found"
    plans = dataclasses.replace(simulated_plans, device=no_gpu(reason))
    line = devices_line(plans, "m.gguf", cpu_enabled=True)
    assert line.startswith(f"model m.gguf; no GPU worker ({reason}); CPU n_ctx ")
    assert "GPU n_ctx" not in line and "simulated" not in line.lower()
    assert devices_line(plans, "m.gguf", cpu_enabled=False).endswith("; no CPU worker")


def test_a_real_gpu_is_named_as_llama_cpp_lists_it(simulated_plans: PlanSet) -> None:
    device = dataclasses.replace(simulated_plans.device, simulated=False, name="NVIDIA GeForce RTX 4090")
    target = PlanTarget("gpu", "CUDA0 (NVIDIA GeForce RTX 4090), cuda", "cuda", "CUDA0")
    plans = dataclasses.replace(simulated_plans, device=device, target=target)
    line = devices_line(plans, "m.gguf", cpu_enabled=True)
    assert line.startswith("model m.gguf; GPU CUDA0 (NVIDIA GeForce RTX 4090), cuda: n_ctx ")
    assert "simulated" not in line.lower()


def test_a_port_in_use_is_refused_at_once_with_what_to_do(tmp_path: Path) -> None:
    port = free_port()
    taken = listening_socket("127.0.0.1", port)
    taken.listen()
    started = time.monotonic()
    with taken:
        done = _serve(tmp_path, {"server": {"port": port}, "device": {"simulate_vram": "4GiB"}})
    assert done.returncode == 1, done
    assert f"failsoft serve: cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert f"something listens at http://127.0.0.1:{port} but gives no HTTP answer" in done.stderr
    assert "another port: --port" in done.stderr
    # Refused before the model was read or a worker started: nothing else was printed.
    assert "model" not in done.stdout and "listening" not in done.stdout
    assert time.monotonic() - started < 30


def test_a_missing_model_file_is_named_without_a_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "model.gguf"
    done = _serve(tmp_path, {"server": {"port": free_port()}, "model": {"path": str(missing)}})
    assert done.returncode == 2, done
    assert done.stderr.strip() == f"failsoft: {missing}: model file not found"


def test_a_public_url_beyond_loopback_without_an_api_key_is_refused_in_one_line(tmp_path: Path) -> None:
    """Review 3, F9: behind a reverse proxy the service answered whoever reached the proxy, with no key."""
    port = free_port()
    settings = {"server": {"port": port, "public_url": "https://ai.example.org"}}
    done = _serve(tmp_path, {**settings, "device": {"simulate_vram": "4GiB"}})
    assert done.returncode == 2, done
    config_path = tmp_path / "config.toml"
    assert done.stderr.strip() == (
        f"failsoft: {config_path}: refusing to serve server.public_url https://ai.example.org without "
        "server.api_key: whoever reaches that address could use the service; set an API key in the config, "
        "or remove public_url"
    )
    assert "listening" not in done.stdout and "model" not in done.stdout  # refused before anything started
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


@pytest.mark.parametrize(
    ("server", "refused"),
    [
        ({"public_url": "https://ai.example.org"}, True),
        ({"public_url": "http://192.168.1.20:8750"}, True),
        ({"public_url": "https://ai.example.org", "api_key": "sk-long-random"}, False),
        ({"public_url": "http://127.0.0.1:8750"}, False),
        ({"public_url": "http://localhost:8750"}, False),
        ({"public_url": "http://[::1]:8750"}, False),
        ({}, False),
    ],
)
def test_which_public_urls_need_a_key(server: dict[str, str], refused: bool) -> None:
    cfg = config.from_dict({"server": server})
    if refused:
        with pytest.raises(config.ConfigError, match=r"without server\.api_key"):
            check_bind(cfg)
    else:
        check_bind(cfg)


@pytest.mark.integration
def test_a_second_service_on_the_same_journal_or_port_is_refused_and_the_first_keeps_serving(
    tmp_path: Path,
) -> None:
    with running_service(tmp_path / "first") as first:
        pid = first.process.pid
        done = _serve(
            tmp_path / "second",
            {"server": {"port": free_port()}, "device": {"simulate_vram": "4GiB"}},
            data_dir=first.data_dir,
        )
        same_port = _serve(
            tmp_path / "third",
            {"server": {"port": int(first.base_url.rsplit(":", 1)[1])}, "device": {"simulate_vram": "4GiB"}},
        )
        assert same_port.returncode == 1, same_port
        assert same_port.stderr.startswith("failsoft serve: Failsoft ")
        assert same_port.stderr.rstrip().endswith(f" at {first.base_url} is already running")
        assert done.returncode == 1, done
        assert done.stderr.startswith(
            f"failsoft serve: another Failsoft service (pid {pid}) uses the journal"
        )
        assert "FAILSOFT_DATA_DIR" in done.stderr and "Traceback" not in done.stderr
        # Refused before any worker started, and the first service's own work goes on.
        assert "listening" not in done.stdout
        answer = httpx.post(
            f"{first.base_url}/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=60
        )
        assert answer.status_code == 200, answer.text


def _serve(
    root: Path, settings: dict[str, object], data_dir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`failsoft serve` with `settings` as its config, its files under `root` (its journal in `data_dir`,
    else root/data); run until it exits."""
    config_path = root / "config.toml"
    write_config(config_path, settings)
    env = {name: value for name, value in os.environ.items() if not name.startswith("FAILSOFT_")}
    env.update(FAILSOFT_CONFIG=str(config_path), FAILSOFT_DATA_DIR=str(data_dir or root / "data"))
    return subprocess.run(
        [sys.executable, "-m", "tray_app", "serve"], env=env, capture_output=True, text=True, timeout=60
    )
