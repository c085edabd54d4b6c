"""The tiny MoE GGUF is a real model: the bundled llama-server loads it with the command line an expert split
produces (`--n-gpu-layers` all, `--n-cpu-moe N`, `--override-tensor` for single expert tensors) and answers
a chat request.

This build is CPU only: it ignores `--n-gpu-layers` ("no usable GPU found") and prints no per-device
buffers or override lines, so it cannot show where the experts went. What it does show is that
`--n-cpu-moe` matched the file's expert tensors: llama.cpp warns about tensor overrides to the CPU only when
one matched. Where tensors land per device is checked on a build with a GPU device (`make moe-check`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.tiny_moe import write_tiny_moe
from tests.support.waits import wait_until
from tray_app.budget.model_info import inspect_model
from tray_app.budget.plan import PlanRequest
from tray_app.budget.planner import plan_gpu
from tray_app.engine import binary
from tray_app.engine.argv import llama_server_argv
from tray_app.engine.profile import WorkerProfile
from tray_app.host.launch import free_port

from .conftest import MIB, gpu

pytestmark = pytest.mark.integration

OVERRIDE_WARNING = "tensor overrides to CPU are used with mmap enabled"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    model = write_tiny_moe(tmp_path / "tiny-moe.gguf")
    request = PlanRequest(n_ctx=1024, n_parallel=1, reserve_percent=0.0, reserve_min_bytes=0, flash_attn=True)
    plan = plan_gpu(gpu(6 * MIB), inspect_model(model), request)
    # The budget gives an expert split of whole blocks and single tensors of one more.
    assert plan.n_cpu_moe > 0 and plan.cpu_expert_tensors, plan.reason
    profile = WorkerProfile(
        role="gpu",
        model_path=model,
        n_ctx=plan.n_ctx,
        n_gpu_layers=plan.n_gpu_layers,
        n_threads=1,
        n_parallel=plan.n_parallel,
        n_ubatch=plan.n_ubatch,
        flash_attn=plan.flash_attn,
        model_name="tiny-moe",
        n_cpu_moe=plan.n_cpu_moe,
        cpu_expert_tensors=plan.cpu_expert_tensors,
    )
    port = free_port()
    argv = llama_server_argv(binary.find("").path, profile, port)
    assert "--override-tensor" in argv
    log = tmp_path / "llama-server.log"
    with log.open("wb") as output:
        process = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}", log
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_llama_server_loads_the_tiny_moe_with_an_expert_split_and_answers(
    served: tuple[str, Path],
) -> None:
    url, log = served

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, timeout=60, what=f"llama-server on the tiny MoE model (log: {log})")
    body = {"model": "tiny-moe", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] >= 1
    text = log.read_text(errors="replace")
    assert OVERRIDE_WARNING in text
