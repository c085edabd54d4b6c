"""Give the GPU back and come back by itself, through real processes: a real `failsoft serve --simulate-vram
4GiB` (on fake llama-servers), a real `failsoft hog` as the program it yields to, the `failsoft yield` and
`failsoft resume` commands, and requests before, during and after. Every job is answered exactly once."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.fake_worker import fake_llama_server
from tests.support.helpers import base_settings, client_for, events_until_completed, failsoft_of, job_state
from tests.support.hog import FAILSOFT, hog
from tests.support.service import ServiceHandle, running_service
from tray_app.device.ledger import LEDGER_FILE, Ledger

POLL = 0.25
RETURN_AFTER = 1.0
CHAT: dict[str, Any] = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


@pytest.fixture(scope="module", params=["fake", pytest.param("real", marks=pytest.mark.integration)])
def svc(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    """The service on fake llama-servers (fast), and on real ones with the bundled model (integration)."""
    root = tmp_path_factory.mktemp("yield")
    sections: dict[str, dict[str, Any]] = {
        "device": {"poll_seconds": POLL},
        "gpu": {"yield_to": ["comfyui"], "return_after": RETURN_AFTER, "max_returns": 10},
    }
    if request.param == "fake":
        sections["engine"] = {"llama_server": str(fake_llama_server(root, token_delay=0.05))}
    else:
        sections["cpu"] = {"threads": 1}  # two workers on a 2-core machine: no thrashing
    with running_service(root / "service", settings=base_settings(**sections), ready_timeout=120) as handle:
        handle.root.joinpath("engine").write_text(request.param)
        yield handle


def wait_status(
    svc: ServiceHandle, check: Callable[[dict[str, Any]], bool], timeout: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not check(status := svc.status()):
        assert time.monotonic() < deadline, f"not seen within {timeout} s: {status.get('gpu_path')}"
        time.sleep(0.05)
    return status


def ask(svc: ServiceHandle, answers: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    answer = client_for(svc).chat.completions.create(**{**CHAT, **extra})
    info = {**failsoft_of(answer), "tokens": answer.usage.completion_tokens if answer.usage else 0}
    answers.append(info)
    return info


def failsoft_share(svc: ServiceHandle, status: dict[str, Any]) -> int:
    """What Failsoft's workers hold on the simulated GPU's ledger now."""
    pids = {w["pid"] for w in status["workers"].values() if w.get("pid")}
    state = Ledger(svc.runtime_dir / LEDGER_FILE).read()
    return sum(h.num_bytes for h in state.holdings if h.pid in pids or h.label.startswith("gpu"))


def assert_each_answered_once(svc: ServiceHandle, answers: list[dict[str, Any]]) -> None:
    for info in answers:
        job = job_state(svc, info["job_id"])
        assert job["state"] == "completed", job
        completed = [a for a in job["attempt_log"] if a["outcome"] == "completed"]
        assert len(completed) == 1 and completed[0]["worker"] == info["worker"], job["attempt_log"]


def test_a_program_of_yield_to_gets_the_gpu_and_failsoft_comes_back_by_itself(svc: ServiceHandle) -> None:
    answers: list[dict[str, Any]] = []
    assert ask(svc, answers)["worker"] == "gpu"  # before
    long: list[dict[str, Any]] = []
    # About 3 s on the GPU: a fake worker's 60 tokens, or a real model's 300 that do not stop at an end token.
    fake = (svc.root / "engine").read_text() == "fake"
    length: dict[str, Any] = (
        {"max_tokens": 60} if fake else {"max_tokens": 300, "extra_body": {"ignore_eos": True}}
    )
    in_flight = threading.Thread(target=lambda: ask(svc, long, **length))
    in_flight.start()
    wait_status(svc, lambda s: s["workers"]["gpu"].get("in_flight", 0) > 0)
    with hog(svc, "1GiB", "comfyui") as process:
        seen = time.monotonic()
        yielded = wait_status(svc, lambda s: s["gpu_path"]["state"] == "yielded")
        assert f"comfyui (failsoft, pid {process.pid}) appeared" in yielded["gpu_path"]["reason"]
        during = ask(svc, answers)  # a new job while the in-flight one drains: not on the GPU
        assert during["worker"] == "cpu"
        in_flight.join(30)
        assert long[0]["worker"] == "gpu"  # it finished where it ran
        assert long[0]["tokens"] == length["max_tokens"]  # whole
        stopped = wait_status(svc, lambda s: (s["gpu_path"]["yielded"] or {}).get("phase") == "stopped")
        assert stopped["workers"]["gpu"]["state"] == "stopped"
        assert failsoft_share(svc, stopped) == 0  # its memory is the hog's to use now
        drained = time.monotonic() - seen
        assert ask(svc, answers)["worker"] == "cpu"
        time.sleep(RETURN_AFTER + 2 * POLL)
        assert svc.status()["workers"]["gpu"]["state"] == "stopped"  # not while comfyui holds memory
    left = time.monotonic()
    back = wait_status(svc, lambda s: s["workers"]["gpu"]["state"] == "ready")
    returned = time.monotonic() - left
    assert back["gpu_path"]["state"] == "normal" and back["gpu_path"]["returns_in_window"] >= 1
    assert RETURN_AFTER <= returned < RETURN_AFTER + 10, returned
    assert ask(svc, answers)["worker"] == "gpu"  # after
    assert_each_answered_once(svc, answers + long)
    print(
        f"yield: drained and stopped {drained:.2f} s after the hog took; back {returned:.2f} s after it left"
    )


def test_failsoft_yield_and_resume_give_the_gpu_away_until_asked_back(svc: ServiceHandle) -> None:
    svc.wait_workers_ready()
    answers: list[dict[str, Any]] = []
    command = [FAILSOFT, "yield", "--url", svc.base_url]
    # Where the admin token is, and the config that names the service's address (the token goes only there).
    env = {**svc.hog_env(), "FAILSOFT_DATA_DIR": str(svc.data_dir), "FAILSOFT_CONFIG": str(svc.config_path)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "GPU path: yielded (asked with failsoft yield)" in done.stdout
    status = svc.status()
    assert status["workers"]["gpu"]["state"] == "stopped" and failsoft_share(svc, status) == 0
    with events_until_completed(svc) as events:
        assert ask(svc, answers)["worker"] == "cpu"
    (route,) = [data for kind, data in events if kind == "route_decided"]
    assert (route["route"], route["reason"]) == ("cpu", "gpu_unavailable")
    assert route["detail"] == "the GPU is yielded to another program: asked with failsoft yield", route
    time.sleep(RETURN_AFTER + 2 * POLL)  # memory free, but a yield asked for is held until resumed
    assert svc.status()["gpu_path"]["state"] == "yielded"
    resumed = subprocess.run(
        [FAILSOFT, "resume", "--url", svc.base_url], env=env, capture_output=True, text=True, timeout=60
    )
    assert resumed.returncode == 0, resumed.stderr
    back = wait_status(svc, lambda s: s["workers"]["gpu"]["state"] == "ready", timeout=15)
    assert back["gpu_path"]["last_return"]["reason"] == "resumed by request"
    assert ask(svc, answers)["worker"] == "gpu"
    assert_each_answered_once(svc, answers)
