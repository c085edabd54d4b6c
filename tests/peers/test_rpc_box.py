"""One model across two boxes through llama.cpp's RPC backend, with real processes on one machine: a real
`failsoft rpc serve` (rpc-server on its CPU backend, on loopback) as the other machine's device, and a real
`failsoft serve` on a simulated GPU too small for the bundled model. The plan puts layers on both devices,
the GPU worker carries `--rpc`, llama.cpp's own buffers on the box equal the plan, and when the box goes
away mid-stream the answer goes on (the CPU worker) and the plan is made again without it."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.helpers import base_settings, client_for, failsoft_of, job_state, wait_until
from tests.support.rpc_box import RpcBox, rpc_box
from tests.support.service import ServiceHandle, running_service, write_config
from tray_app.engine import binary
from tray_app.engine.devices import DeviceListError, rpc_device
from tray_app.engine.llama_log import as_printed

pytestmark = pytest.mark.integration

SIMULATED = "120MiB"  # the bundled model's 31 layers do not fit: some go to the box, the rest to the CPU
BOX_MEMORY = "60MiB"


def settings(box: RpcBox) -> dict[str, Any]:
    return base_settings(budget={"reserve_min": "16MiB", "reserve_percent": 0}, cpu={"threads": 1}) | {
        "peers": [{"name": "nas", "rpc": box.endpoint, "rpc_memory": BOX_MEMORY}]
    }


@pytest.fixture(scope="module")
def box() -> Iterator[RpcBox]:
    with rpc_box() as running:
        yield running


def plan_json(config: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "tray_app", "--config", str(config), "plan", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    plan: dict[str, Any] = json.loads(done.stdout)
    return plan


def test_failsoft_plan_shows_both_devices_and_the_layers_on_each(box: RpcBox, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    write_config(config, {**settings(box), "device": {"simulate_vram": SIMULATED}})
    plan = plan_json(config)
    (share,) = plan["remote"]
    assert share["endpoint"] == box.endpoint and share["device"] == "RPC0" and share["peer"] == "nas"
    assert share["n_layers"] > 0 and share["used_bytes"] <= share["usable_bytes"] == 60 * 2**20
    on_cpu = plan["n_layers"] - plan["n_gpu_layers"] - share["n_layers"]
    assert plan["n_gpu_layers"] > 0 and on_cpu > 0  # three places: the local GPU, the box, the CPU
    # On a simulated device (a CPU build) the box holds the last layers, the output layer among them.
    assert share["output"] and share["first_layer"] + share["n_layers"] == plan["n_layers"]
    command = [sys.executable, "-m", "tray_app", "--config", str(config), "plan"]
    text = subprocess.run(command, capture_output=True, text=True, timeout=120).stdout
    assert f"RPC0 {share['n_layers']} layers" in text and f"CPU (system RAM): {on_cpu} layers" in text


def test_an_unreachable_box_is_planned_without_and_says_why(tmp_path: Path) -> None:
    with rpc_box() as gone:
        endpoint_settings = settings(gone)
    config = tmp_path / "config.toml"
    write_config(config, {**endpoint_settings, "device": {"simulate_vram": SIMULATED}})
    plan = plan_json(config)
    assert plan["remote"] == [] and "does not answer" in plan["boxes"][0]["problem"]


def test_a_box_busy_with_another_client_is_named_so(box: RpcBox) -> None:
    # rpc-server serves one client at a time: while one holds it, a listing waits, and says why it stopped.
    with socket.create_connection(("127.0.0.1", box.port)) as holder:
        time.sleep(0.5)  # accepted: rpc-server now waits on this client
        with pytest.raises(DeviceListError, match="it serves one client at a time"):
            rpc_device(binary.locate(""), box.endpoint, timeout=3)
        holder.close()
    assert wait_until(lambda: listed(box), 30, "the box free again")


def listed(box: RpcBox) -> bool:
    try:
        return rpc_device(binary.locate(""), box.endpoint, timeout=10).prefix == "RPC"
    except DeviceListError:
        return False


@pytest.fixture(scope="module")
def svc(box: RpcBox, module_root: Path) -> Iterator[ServiceHandle]:
    with running_service(module_root, simulate_vram=SIMULATED, settings=settings(box)) as handle:
        yield handle


def test_the_gpu_worker_spans_the_box_and_llama_cpp_puts_there_what_the_plan_says(
    svc: ServiceHandle, box: RpcBox
) -> None:
    status = svc.status()
    (share,) = status["rpc"]["remote"]
    gpu = status["workers"]["gpu"]
    assert gpu["profile"]["rpc"] == [box.endpoint] and gpu["profile"]["rpc_layers"] == [share["n_layers"]]
    printed = gpu["health"]["buffers"]["model_buffers"]
    assert as_printed(printed[f"RPC0[{box.endpoint}]"]) == as_printed(share["weights_bytes"])
    log = Path(gpu["log_file"]).read_text(errors="replace")
    kv = re.search(rf"RPC0\[{re.escape(box.endpoint)}\] KV buffer size =\s+([\d.]+) MiB", log)
    assert kv is not None and kv.group(1) == as_printed(share["kv_bytes"]), log
    answer = client_for(svc).chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=8
    )
    assert failsoft_of(answer)["worker"] == "gpu"


def test_the_box_gone_mid_stream_the_answer_goes_on_and_the_plan_is_made_without_it(
    svc: ServiceHandle, box: RpcBox
) -> None:
    client = client_for(svc)
    chunks: list[Any] = []
    first = threading.Event()

    def stream() -> None:
        for chunk in client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "Tell me a long story about a river."}],
            max_tokens=200,
            stream=True,
            extra_body={"ignore_eos": True},
        ):
            chunks.append(chunk)
            first.set()

    reading = threading.Thread(target=stream)
    reading.start()
    assert first.wait(60)
    background = submit_background_job(svc)
    wait_until(lambda: svc.status()["workers"]["gpu"].get("in_flight", 0) == 2, 60, "both on the GPU")
    box.kill()
    reading.join(180)
    job = wait_until(lambda: (j := job_state(svc, background))["state"] in ("completed", "failed") and j, 180)
    completed = [attempt for attempt in job["attempt_log"] if attempt["outcome"] == "completed"]
    assert job["state"] == "completed" and len(completed) == 1, job["attempt_log"]  # once, on the CPU
    assert job["attempt_log"][0]["worker"] == "gpu" and completed[0]["worker"] == "cpu"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = [c.usage for c in chunks if c.usage]
    assert text and (not usage or usage[-1].completion_tokens == 200)
    (said,) = [c.failsoft for c in chunks if getattr(c, "failsoft", None)]  # type: ignore[attr-defined]
    # Its worker died with the box (llama.cpp aborts on a lost RPC connection): the CPU worker went on.
    assert (said["worker"], said["attempts"], said["fallback_reason"]) == ("cpu", 2, "crash_abort")
    status = wait_until(
        lambda: (
            (s := svc.status())["workers"]["gpu"]["state"] == "ready"
            and not s["workers"]["gpu"]["profile"]["rpc"]
            and s
        ),
        120,
        "the GPU worker started again without the box",
    )
    assert status["rpc"]["remote"] == [] and "does not answer" in status["rpc"]["boxes"][0]["problem"]
    answer = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=8
    )
    assert failsoft_of(answer)["worker"] == "gpu"


def submit_background_job(svc: ServiceHandle) -> str:
    body = {
        "kind": "chat",
        "model": "default",
        "messages": [{"role": "user", "content": "Write a long poem about rain."}],
        "max_tokens": 200,
        "ignore_eos": True,
    }
    headers = {**svc.headers(), "Idempotency-Key": "rpc-box-nightly-1"}
    created = httpx.post(svc.base_url + "/v1/jobs", json=body, headers=headers, timeout=30)
    assert created.status_code == 202, created.text
    job_id: str = created.json()["id"]
    return job_id


def test_a_box_back_on_the_lan_is_planned_with_again_at_the_gpu_workers_next_start(
    svc: ServiceHandle, box: RpcBox
) -> None:
    with rpc_box(port=box.port) as back:
        restarted = httpx.post(
            f"{svc.base_url}/failsoft/workers/gpu/restart", headers=svc.headers(), timeout=120
        )
        assert restarted.status_code == 200, restarted.text
        status = wait_until(
            lambda: (s := svc.status())["workers"]["gpu"]["state"] == "ready" and s, 120, "the GPU worker"
        )
        assert status["workers"]["gpu"]["profile"]["rpc"] == [box.endpoint]
        assert status["rpc"]["remote"][0]["n_layers"] > 0 and not status["rpc"]["boxes"][0]["problem"]
        answer = client_for(svc).chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=8
        )
        assert failsoft_of(answer)["worker"] == "gpu"
        # And gone again while the worker is idle: it is restarted without the box before any request
        # meets the lost connection (host.rpc_watch), not after one failed there.
        before = svc.status()
        back.kill()
        gone = wait_until(
            lambda: (
                (s := svc.status())["workers"]["gpu"]["state"] == "ready"
                and not s["workers"]["gpu"]["profile"]["rpc"]
                and s
            ),
            60,
            "the idle GPU worker restarted without the box",
        )
        assert "does not answer" in gone["rpc"]["boxes"][0]["problem"]
        assert gone["workers"]["gpu"]["restarts"] > before["workers"]["gpu"]["restarts"]
        answer = client_for(svc).chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=8
        )
        said = failsoft_of(answer)
        assert (said["worker"], said["attempts"]) == ("gpu", 1)  # no request paid for the lost box
        after, counted = svc.status()["counters"], before["counters"]
        assert after["completed"] == counted["completed"] + 1
        assert after.get("failed", 0) == counted.get("failed", 0)
