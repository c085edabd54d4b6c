"""Making room on the GPU with real workers: an idle model is unloaded for a new one, a model with a request
in flight never is (the new one then takes the ladder), and nothing in flight is touched."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.support.helpers import CHAT, base_settings, wait_until
from tests.support.models import gemma_path
from tests.support.service import ServiceHandle, running_service

pytestmark = pytest.mark.integration

GEMMA = "gemma3-270m"
LONG = {"messages": [{"role": "user", "content": "Count from one to one hundred."}], "max_tokens": 160}


@pytest.fixture(scope="module")
def svc(module_root: Path, model_path: Path) -> Iterator[ServiceHandle]:
    settings = base_settings(cpu={"max_ctx": 4096}, library={"max_loaded": 1})
    settings["models"] = [
        {"name": GEMMA, "path": str(gemma_path()), "keep_alive": "-1", "n_ctx": 2048, "n_parallel": 1},
        {"name": "smol-b", "path": str(model_path), "keep_alive": "-1", "n_ctx": 2048, "n_parallel": 1},
    ]
    with running_service(module_root, settings=settings) as handle:
        yield handle


def where(svc: ServiceHandle, name: str) -> str:
    status = svc.status()
    found: str = next(model["where"] for model in status["models"] if model["name"] == name)
    return found


def gpu_pid(svc: ServiceHandle, name: str) -> int | None:
    pid: int | None = svc.status()["library_workers"][f"gpu@{name}"]["pid"]
    return pid


def ask(svc: ServiceHandle, model: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    request = {"model": model, "temperature": 0, **(body or {"messages": CHAT, "max_tokens": 8})}
    response = httpx.post(svc.v1 + "/chat/completions", json=request, timeout=180)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def in_background(svc: ServiceHandle, model: str) -> tuple[threading.Thread, list[dict[str, Any]]]:
    answers: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: answers.append(ask(svc, model, LONG)))
    thread.start()
    return thread, answers


def test_an_idle_model_makes_room_and_the_request_in_flight_is_not_touched(
    svc: ServiceHandle, model_path: Path
) -> None:
    loaded = httpx.post(
        f"{svc.base_url}/failsoft/models/smol-b/load",
        json={"device": "gpu"},
        timeout=120,
        headers=svc.headers(),
    )
    assert loaded.status_code == 200, loaded.text
    old_pid = gpu_pid(svc, "smol-b")
    main_pid = svc.status()["workers"]["gpu"]["pid"]
    thread, answers = in_background(svc, "default")  # a long answer on the main model meanwhile
    wait_until(lambda: svc.status()["workers"]["gpu"]["in_flight"] == 1, what="the main model's request")
    answer = ask(svc, GEMMA)
    assert (answer["failsoft"]["worker"], answer["model"]) == (f"gpu@{GEMMA}", GEMMA)
    assert where(svc, "smol-b") == "not loaded"  # max_loaded 1: the idle one made room
    assert old_pid is not None and not psutil.pid_exists(old_pid)
    thread.join(180)
    main = answers[0]["failsoft"]
    assert (main["worker"], main["attempts"], main["fallback_reason"]) == ("gpu", 1, None)
    assert svc.status()["workers"]["gpu"]["pid"] == main_pid


def test_a_model_with_a_request_in_flight_is_never_unloaded(svc: ServiceHandle) -> None:
    ask(svc, GEMMA)
    busy_pid = gpu_pid(svc, GEMMA)
    thread, answers = in_background(svc, GEMMA)
    wait_until(
        lambda: next(m for m in svc.status()["models"] if m["name"] == GEMMA)["in_flight"] == 1,
        what="Gemma busy",
    )
    other = ask(svc, "smol-b")["failsoft"]
    # No room on the GPU (Gemma is busy, max_loaded 1) and no stand-in: smol-b's own CPU worker answers.
    assert (other["worker"], other["device"], other["model"]) == ("cpu@smol-b", "cpu", "smol-b")
    thread.join(180)
    busy = answers[0]["failsoft"]
    assert (busy["worker"], busy["attempts"]) == (f"gpu@{GEMMA}", 1)
    assert gpu_pid(svc, GEMMA) == busy_pid and where(svc, GEMMA).startswith("gpu")
