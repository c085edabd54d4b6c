"""A real `failsoft serve --simulate-vram 4GiB` on fake llama-servers and real `failsoft hog` processes: a
hog is named in the status, the tray's bar, `failsoft status`, `/metrics` and the history within two polls;
a GPU worker killed while a hog holds memory comes back with a plan that fits what is free, or stays off the
GPU saying who holds the memory, and comes back by itself once the hog is gone. No load out-of-memory, no
restart loop."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fake_worker import fake_llama_server
from tests.support.helpers import arm, base_settings, client_for, failsoft_of
from tests.support.hog import hog
from tests.support.service import ServiceHandle, running_service
from tray_app.console.status_text import render_status
from tray_app.contract.sizes import format_size
from tray_app.device.ledger import LEDGER_FILE, Ledger
from tray_app.view.budget_split import status_segments

GIB = 1024**3
MIB = 1024**2
POLL = 0.25
SETTINGS = {
    "device": {"poll_seconds": POLL},
    "gpu": {"return_after": 1.0, "max_returns": 10},
    # A reserve larger than the GPU worker's plan: a hog can leave the worker too little to start at all.
    "budget": {"reserve_min": "1GiB"},
}


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    root = tmp_path_factory.mktemp("device-now")
    engine = fake_llama_server(root)
    settings = base_settings(engine={"llama_server": str(engine)}, **SETTINGS)
    with running_service(root / "service", enable_faults=True, settings=settings, ready_timeout=30) as handle:
        yield handle


def wait_status(
    svc: ServiceHandle, check: Callable[[dict[str, Any]], bool], timeout: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status = svc.status()
        if check(status) or time.monotonic() > deadline:
            assert check(status), (
                f"not seen within {timeout} s: {status.get('device_now')} {status.get('gpu_path')}"
            )
            return status
        time.sleep(0.05)


def holding(status: dict[str, Any], pid: int) -> dict[str, Any] | None:
    return next((p for p in status["device_now"]["processes"] if p["pid"] == pid), None)


def need(plan: dict[str, Any]) -> int:
    return int(plan["weights_bytes"] + plan["kv_bytes"] + plan["compute_bytes"])


def test_a_hog_is_named_everywhere_within_two_polls(svc: ServiceHandle) -> None:
    with hog(svc, "512MiB", "blender") as process:
        polls = svc.status()["device_now"]["polls"]  # at most the reading after its take is still to come
        status = wait_status(svc, lambda s: holding(s, process.pid) is not None)
        assert status["device_now"]["polls"] - polls <= 2
        seen = holding(status, process.pid)
        assert seen is not None
        assert (seen["label"], seen["used_bytes"], seen["own"]) == ("blender", 512 * MIB, False)
        assert seen["describe"] == f"blender ({seen['name']}, pid {process.pid})"
        own = [p for p in status["device_now"]["processes"] if p["own"]]
        assert [p["label"] for p in own] == ["gpu"]  # the GPU worker's share, under its own pid
        assert own[0]["pid"] == status["workers"]["gpu"]["pid"]

        other = next(s for s in status_segments(status) if s.key == "other")  # the tray's bar
        assert (
            other.bytes == 512 * MIB
            and f"blender ({seen['name']}, pid {process.pid}) 512.00 MiB" in other.detail
        )
        text = render_status(status, svc.base_url, time.time())  # `failsoft status`
        assert f"other    blender ({seen['name']}, pid {process.pid}) 512.00 MiB" in text

        metrics = httpx.get(svc.base_url + "/metrics", timeout=10).text
        assert (
            f'failsoft_gpu_process_bytes{{label="blender",name="{seen["name"]}",own="false",pid="{process.pid}"}}'
            in metrics
        )
        history = httpx.get(svc.base_url + "/failsoft/device/history", timeout=10)  # read-only: no token
        assert history.status_code == 200
        samples = history.json()["samples"]
        assert any(p["pid"] == process.pid for p in samples[-1]["processes"])
        assert samples[0]["at"] < samples[-1]["at"] and history.json()["poll_seconds"] == POLL
    gone = wait_status(svc, lambda s: holding(s, process.pid) is None)
    assert all(p["label"] != "blender" for p in gone["device_now"]["processes"])


def test_a_gpu_worker_killed_under_a_hog_comes_back_smaller_or_stays_off_saying_why(
    svc: ServiceHandle,
) -> None:
    status = svc.wait_workers_ready()
    total, plan = status["device_now"]["total_bytes"], status["plan"]
    full, reserve = need(plan), plan["reserve_bytes"]
    assert full // 2 <= reserve < full + reserve  # the sizes below rely on it

    # 1. A hog leaves the worker's restart half its plan: it comes back smaller, not out of memory.
    with hog(svc, str(total - reserve - full // 2), "comfyui"):
        squeezed = wait_status(svc, lambda s: s["gpu_path"]["state"] == "squeezed")
        assert "comfyui" in squeezed["gpu_path"]["reason"]
        assert squeezed["workers"]["gpu"]["state"] == "ready"  # what is loaded keeps serving
        killed = arm(svc, "kill")["pid"]
        back = wait_status(
            svc, lambda s: s["workers"]["gpu"]["state"] == "ready" and s["workers"]["gpu"]["pid"] != killed
        )
        worker = back["workers"]["gpu"]
        back = wait_status(svc, lambda s: holding(s, worker["pid"]) is not None)  # the next reading has it
        assert worker["last_failure"]["kind"] == "killed"
        assert worker["profile"]["n_ctx"] < plan["n_ctx"]
        share = holding(back, worker["pid"])
        assert share is not None and share["used_bytes"] + reserve <= total - (total - reserve - full // 2)
        answer = client_for(svc).chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert failsoft_of(answer)["worker"] == "gpu"
    smaller = share["used_bytes"]

    # 2. A hog takes everything free: the killed worker is not started at all, and says who holds it.
    with hog(svc, str(total - smaller), "comfyui") as process:
        wait_status(svc, lambda s: holding(s, process.pid) is not None)
        restarts = svc.status()["workers"]["gpu"]["restarts"]
        arm(svc, "kill")
        off = wait_status(svc, lambda s: s["workers"]["gpu"]["state"] == "stopped")
        reason = off["workers"]["gpu"]["reason"]
        assert (
            reason.startswith("gpu not started on the GPU")
            and f"comfyui (failsoft, pid {process.pid}) holds" in reason
        )
        assert off["gpu_path"]["state"] == "squeezed" and off["gpu_path"]["held_back"] == {"gpu": reason}
        answer = client_for(svc).chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert failsoft_of(answer)["worker"] == "cpu"
        time.sleep(4 * POLL)
        still = svc.status()["workers"]["gpu"]
        assert still["state"] == "stopped" and still["restarts"] <= restarts + 1  # no restart loop
        assert not Ledger(svc.runtime_dir / LEDGER_FILE).read().held_by(off["workers"]["gpu"]["pid"] or -1)

    # 3. The hog is gone: the GPU worker is back by itself, with the whole plan.
    back = wait_status(svc, lambda s: s["workers"]["gpu"]["state"] == "ready", timeout=30)
    assert (
        back["gpu_path"]["state"] == "normal" and back["workers"]["gpu"]["profile"]["n_ctx"] == plan["n_ctx"]
    )
    assert f"{format_size(full)}" in format_size(need(back["plan"]))
    history = httpx.get(svc.base_url + "/failsoft/device/history", timeout=10).json()
    marked = {marker["kind"] for marker in history["markers"]}
    assert {"restart", "load", "path"} <= marked  # what the timeline shows beside the readings


def test_a_library_model_load_is_weighed_on_the_memory_free_now(tmp_path: Path, model_path: Path) -> None:
    """Its share of the main plan says it fits; the device now does not: the load is refused, naming the hog,
    before any process starts, and a request for it goes down the ladder (here: its own CPU worker)."""
    engine = fake_llama_server(tmp_path)
    settings = base_settings(engine={"llama_server": str(engine)}, **SETTINGS)
    settings["models"] = [{"name": "other", "path": str(model_path), "n_ctx": 2048, "n_parallel": 1}]
    with running_service(tmp_path / "service", settings=settings, ready_timeout=30) as svc:
        status = svc.status()
        assert next(m for m in status["models"] if m["name"] == "other")["plan"] is not None
        # The ledger itself, not the watcher's last reading: that may predate a worker's own holding.
        free = Ledger(svc.runtime_dir / LEDGER_FILE).read().free_bytes
        with hog(svc, str(free - 16 * MIB), "comfyui") as process:
            wait_status(svc, lambda s: holding(s, process.pid) is not None)
            load = httpx.post(
                svc.base_url + "/failsoft/models/other/load",
                json={"device": "gpu"},
                headers=svc.headers(),
                timeout=60,
            )
            assert load.status_code == 409, load.text
            message = load.json()["error"]["message"]
            # The re-plan on the reading left it no GPU plan; the refusal still names who holds the memory.
            assert message.startswith("other does not fit on the GPU now: gpu@other not started on the GPU")
            assert f"comfyui (failsoft, pid {process.pid}) holds" in message
            after = svc.status()  # nothing was started to fail
            assert next(m for m in after["models"] if m["name"] == "other")["where"] == "not loaded"
            assert all(p["label"] != "gpu@other" for p in after["device_now"]["processes"])
            answer = client_for(svc).chat.completions.create(
                model="other", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
            assert failsoft_of(answer)["worker"] == "cpu@other"
