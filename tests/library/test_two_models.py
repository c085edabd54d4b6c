"""Two real models behind one service: the bundled SmolLM2 (the main model) and Gemma 3 270M (a library
model loaded on demand, with SmolLM2 as its stand-in), on real llama-server workers and a simulated GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.support.helpers import (
    CHAT,
    arm,
    base_settings,
    client_for,
    failsoft_of,
    reload_settings,
    wait_until,
)
from tests.support.models import gemma_path
from tests.support.service import ServiceHandle, running_service
from tray_app.budget.plan import PLAN_PARTS
from tray_app.reach import admin_token

pytestmark = pytest.mark.integration

GEMMA = "gemma3-270m"
KEEP_ALIVE = 3.0


def library_settings(model_path: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    settings = base_settings(cpu={"max_ctx": 4096}, **sections)
    settings["models"] = [
        {
            "name": GEMMA,
            "path": str(gemma_path()),
            "aliases": ["gemma"],
            "stand_in": model_path.name,
            "keep_alive": f"{KEEP_ALIVE}s",
            "n_ctx": 4096,
        },
        # The same small file under a second name: a second library model for the eviction rule.
        {"name": "smol-b", "path": str(model_path), "keep_alive": "-1", "n_ctx": 2048, "n_parallel": 1},
    ]
    return settings


@pytest.fixture(scope="module")
def svc(module_root: Path, model_path: Path) -> Iterator[ServiceHandle]:
    with running_service(module_root, settings=library_settings(model_path), enable_faults=True) as handle:
        yield handle


def admin_env(svc: ServiceHandle) -> dict[str, str]:
    """A terminal's environment with the service's admin token (its data folder is not this user's) and its
    config (which names its address: the token found here goes only there)."""
    return {**os.environ, admin_token.ENV_VARIABLE: svc.admin_token, "FAILSOFT_CONFIG": str(svc.config_path)}


def model_status(svc: ServiceHandle, name: str) -> dict[str, Any]:
    status = svc.status()
    found: dict[str, Any] = next(model for model in status["models"] if model["name"] == name)
    return found


def ask(svc: ServiceHandle, model: str, **headers: str) -> httpx.Response:
    body = {"model": model, "messages": CHAT, "max_tokens": 8, "temperature": 0}
    response = httpx.post(svc.v1 + "/chat/completions", json=body, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    return response


def unload(svc: ServiceHandle, name: str) -> dict[str, Any]:
    response = httpx.post(f"{svc.base_url}/failsoft/models/{name}/unload", timeout=60, headers=svc.headers())
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def test_each_model_answers_on_its_own_workers_and_says_so(svc: ServiceHandle, model_path: Path) -> None:
    client = client_for(svc)
    main = client.chat.completions.create(model="default", messages=CHAT, max_tokens=8)  # type: ignore[arg-type]
    assert (failsoft_of(main)["model"], failsoft_of(main)["worker"]) == (model_path.name, "gpu")
    assert model_status(svc, GEMMA)["where"] == "not loaded"
    started = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(
        model="gemma",  # an alias
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=8,
    )
    print(f"first Gemma request, loading it on the simulated GPU: {time.monotonic() - started:.2f} s")
    answer = raw.parse()
    assert answer.model == GEMMA and answer.choices[0].message.content
    failsoft = failsoft_of(answer)
    assert failsoft["worker"] == f"gpu@{GEMMA}" and failsoft["device"] == "gpu"
    assert failsoft["model"] == GEMMA and failsoft["stand_in_for"] is None
    assert (raw.headers["x-failsoft-model"], raw.headers["x-failsoft-device"]) == (GEMMA, "gpu")
    loaded = model_status(svc, GEMMA)
    assert loaded["where"] in ("gpu", "gpu+cpu") and loaded["in_flight"] == 0
    assert (
        loaded["vram_bytes"]
        == loaded["plan"]["weights_bytes"] + loaded["plan"]["kv_bytes"] + loaded["plan"]["compute_bytes"]
    )
    # A stream through the same model: the last chunk names who answered.
    chunks = list(client.chat.completions.create(model=GEMMA, messages=CHAT, max_tokens=4, stream=True))  # type: ignore[arg-type]
    assert failsoft_of(chunks[-1])["model"] == GEMMA


def test_the_budget_adds_up_per_model(svc: ServiceHandle) -> None:
    unload(svc, "smol-b")
    ask(svc, GEMMA)
    status = svc.status()
    plan = status["plan"]  # the main model's GPU plan: the device's whole budget
    assert sum(plan[part] for part in PLAN_PARTS) == plan["total_bytes"]
    models = {model["name"]: model for model in status["models"]}
    main = next(model for model in status["models"] if model["main"])
    assert main["vram_bytes"] == plan["weights_bytes"] + plan["kv_bytes"] + plan["compute_bytes"]
    # The other models share what the main plan (and its embeddings plan) leave free, never the reserve.
    share = status["embeddings_plan"]["free_bytes"] if status["embeddings_plan"] else plan["free_bytes"]
    loaded = [model["vram_bytes"] for model in models.values() if not model["main"]]
    assert 0 < sum(loaded) <= share
    assert models[GEMMA]["vram_bytes"] > 0 and models["smol-b"]["vram_bytes"] == 0


def test_an_idle_model_is_unloaded_after_its_keep_alive(svc: ServiceHandle) -> None:
    ask(svc, GEMMA)
    worker = svc.status()["library_workers"][f"gpu@{GEMMA}"]
    pid = worker["pid"]
    assert pid is not None and psutil.pid_exists(pid)
    unload_in = model_status(svc, GEMMA)["unload_in"]
    assert unload_in is not None and 0 < unload_in <= KEEP_ALIVE
    gone = wait_until(
        lambda: model_status(svc, GEMMA)["where"] == "not loaded", timeout=KEEP_ALIVE + 10, what="unload"
    )
    assert gone  # "not loaded" once its workers have stopped: the process is gone
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert model_status(svc, GEMMA)["vram_bytes"] == 0
    # The main model is never unloaded.
    assert next(model for model in svc.status()["models"] if model["main"])["where"] == "gpu+cpu"


def test_a_request_keep_alive_overrides_the_models(svc: ServiceHandle) -> None:
    body = {"model": GEMMA, "messages": CHAT, "max_tokens": 2, "keep_alive": "1h"}
    response = httpx.post(svc.v1 + "/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    status = model_status(svc, GEMMA)
    assert status["keep_alive"] == 3600.0 and status["unload_in"] is not None and status["unload_in"] > 3000
    bad = httpx.post(svc.v1 + "/chat/completions", json={**body, "keep_alive": "soon"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "keep_alive"
    unload(svc, GEMMA)


def test_v1_models_lists_every_model_and_where_it_is(svc: ServiceHandle, model_path: Path) -> None:
    listing = httpx.get(svc.v1 + "/models", timeout=10).json()["data"]
    assert [model["id"] for model in listing] == [model_path.name, GEMMA, "smol-b"]
    by_id = {model["id"]: model["failsoft"] for model in listing}
    assert by_id[model_path.name]["main"] and by_id[model_path.name]["where"] == "gpu+cpu"
    assert by_id[GEMMA]["stand_in"] == model_path.name and by_id[GEMMA]["aliases"] == ["gemma"]
    missing = httpx.post(
        svc.v1 + "/chat/completions", json={"model": "llama-70b", "messages": CHAT}, timeout=10
    )
    assert missing.status_code == 404
    error = missing.json()["error"]
    assert error["code"] == "model_not_found" and GEMMA in error["message"] and "smol-b" in error["message"]


def test_load_and_unload_by_hand(svc: ServiceHandle, model_path: Path) -> None:
    loaded = httpx.post(
        f"{svc.base_url}/failsoft/models/smol-b/load",
        json={"device": "gpu"},
        timeout=120,
        headers=svc.headers(),
    )
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["where"] in ("gpu", "gpu+cpu") and loaded.json()["unload_in"] is None  # kept
    assert unload(svc, "smol-b")["where"] == "not loaded"
    main = httpx.post(
        f"{svc.base_url}/failsoft/models/{model_path.name}/unload", timeout=10, headers=svc.headers()
    )
    assert main.status_code == 409 and main.json()["error"]["code"] == "main_model"
    unknown = httpx.post(f"{svc.base_url}/failsoft/models/nope/load", timeout=10, headers=svc.headers())
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_models_are_loaded_and_unloaded_from_a_terminal(svc: ServiceHandle, model_path: Path) -> None:
    def failsoft(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "tray_app", "--config", str(svc.config_path), *args]
        return subprocess.run(
            [*command, "--url", svc.base_url], capture_output=True, text=True, timeout=300, env=admin_env(svc)
        )

    loaded = failsoft("load", "smol-b", "--device", "gpu")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.startswith("smol-b · on the GPU") and model_status(svc, "smol-b")["where"] == "gpu"
    unloaded = failsoft("unload", "smol-b")
    assert unloaded.stdout.strip() == "smol-b · not loaded"
    assert model_status(svc, "smol-b")["where"] == "not loaded"
    main = failsoft("unload", model_path.name)
    assert main.returncode == 1 and "is the main model: its workers are always kept" in main.stderr
    unknown = failsoft("load", "nope")
    assert unknown.returncode == 1 and f"no model 'nope'; models are {model_path.name}" in unknown.stderr


def load_on_the_gpu(svc: ServiceHandle, name: str) -> None:
    loaded = httpx.post(
        f"{svc.base_url}/failsoft/models/{name}/load",
        json={"device": "gpu"},
        timeout=120,
        headers=svc.headers(),
    )
    assert loaded.status_code == 200 and loaded.json()["where"] == "gpu", loaded.text


def test_a_gpu_failure_of_the_big_model_is_answered_by_its_stand_in_on_the_gpu(
    svc: ServiceHandle, model_path: Path
) -> None:
    load_on_the_gpu(svc, GEMMA)
    arm(svc, "abort", role=f"gpu@{GEMMA}")
    answer = ask(svc, GEMMA).json()
    failsoft = answer["failsoft"]
    assert failsoft["model"] == model_path.name and failsoft["stand_in_for"] == GEMMA
    assert (failsoft["worker"], failsoft["device"], failsoft["attempts"]) == ("gpu", "gpu", 2)
    assert failsoft["fallback_reason"] == "stand_in" and answer["model"] == model_path.name
    # Refused by the request: the big model on the CPU instead (the ladder's last rung).
    wait_until(lambda: model_status(svc, GEMMA)["where"] != "loading", what="Gemma back")
    load_on_the_gpu(svc, GEMMA)
    arm(svc, "abort", role=f"gpu@{GEMMA}")
    refused = ask(svc, GEMMA, **{"X-Failsoft-Stand-In": "no"}).json()["failsoft"]
    assert (refused["model"], refused["worker"], refused["stand_in_for"]) == (GEMMA, f"cpu@{GEMMA}", None)
    assert refused["fallback_reason"] == "crash_abort"


def _pick_in_the_window(svc: ServiceHandle, job_id: str) -> None:
    picked = httpx.post(f"{svc.base_url}/failsoft/jobs/{job_id}/stand-in", timeout=60, headers=svc.headers())
    assert picked.status_code == 200, picked.text


def _pick_in_a_terminal(svc: ServiceHandle, job_id: str) -> None:
    command = [sys.executable, "-m", "tray_app", "--config", str(svc.config_path), "approve", "--stand-in"]
    picked = subprocess.run(
        [*command, job_id, "--url", svc.base_url], capture_output=True, text=True, env=admin_env(svc)
    )
    assert picked.returncode == 0, picked.stderr
    assert picked.stdout.startswith(f"{job_id}: answered now by the smaller model on the GPU")


@pytest.mark.parametrize("pick", [_pick_in_the_window, _pick_in_a_terminal])
def test_the_user_may_pick_the_stand_in_instead_of_the_slow_cpu_run(
    svc: ServiceHandle, model_path: Path, pick: Callable[[ServiceHandle, str], None]
) -> None:
    """library.stand_in "ask": the stand-in does not answer on its own; the job waits for approval with the
    stand-in offered, and picking it (in the approvals window, or `failsoft approve --stand-in`) answers on
    the GPU now."""
    asking = library_settings(model_path, library={"stand_in": "ask"}, failover={"fallback": "approval"})
    reload_settings(svc, asking)
    try:
        httpx.post(
            f"{svc.base_url}/failsoft/models/{GEMMA}/load",
            json={"device": "gpu"},
            timeout=120,
            headers=svc.headers(),
        )
        arm(svc, "abort", role=f"gpu@{GEMMA}")
        answers: list[httpx.Response] = []
        client = threading.Thread(target=lambda: answers.append(ask(svc, GEMMA)))
        client.start()

        def offered() -> dict[str, Any] | None:
            jobs = httpx.get(
                f"{svc.base_url}/failsoft/jobs?state=awaiting_approval", timeout=10, headers=svc.headers()
            ).json()["data"]
            return jobs[0] if jobs else None

        job = wait_until(offered, what="the job waiting for approval")
        assert job["stand_in_offer"] == model_path.name and job["model"] == GEMMA
        pick(svc, job["id"])
        client.join(120)
        failsoft = answers[0].json()["failsoft"]
        assert (failsoft["model"], failsoft["stand_in_for"], failsoft["device"]) == (
            model_path.name,
            GEMMA,
            "gpu",
        )
        again = httpx.post(
            f"{svc.base_url}/failsoft/jobs/{job['id']}/stand-in", timeout=10, headers=svc.headers()
        )
        assert again.status_code == 409  # it no longer waits
    finally:
        reload_settings(svc, library_settings(model_path))


def test_ollama_clients_see_every_model_and_what_is_loaded(svc: ServiceHandle, model_path: Path) -> None:
    tags = httpx.get(svc.base_url + "/api/tags", timeout=30).json()["models"]
    assert [tag["name"] for tag in tags] == [f"{model_path.stem}:latest", f"{GEMMA}:latest", "smol-b:latest"]
    assert tags[1]["details"]["family"] == "gemma3"
    # Ollama's "load" call (no messages) loads it; keep_alive 0 unloads it.
    loaded = httpx.post(
        svc.base_url + "/api/chat", json={"model": f"{GEMMA}:latest", "messages": []}, timeout=120
    )
    assert loaded.status_code == 200 and loaded.json()["done_reason"] == "load"
    running = {
        model["name"]: model for model in httpx.get(svc.base_url + "/api/ps", timeout=30).json()["models"]
    }
    assert running[f"{GEMMA}:latest"]["size_vram"] == model_status(svc, GEMMA)["vram_bytes"] > 0
    assert running[f"{model_path.stem}:latest"]["expires_at"] > running[f"{GEMMA}:latest"]["expires_at"]
    answer = httpx.post(
        svc.base_url + "/api/chat",
        json={"model": "gemma", "messages": CHAT, "stream": False, "options": {"num_predict": 4}},
        timeout=120,
    )
    assert answer.status_code == 200 and answer.headers["x-failsoft-model"] == GEMMA
    unloaded = httpx.post(
        svc.base_url + "/api/generate", json={"model": GEMMA, "prompt": "", "keep_alive": 0}, timeout=60
    )
    assert unloaded.json()["done_reason"] == "unload"
    assert model_status(svc, GEMMA)["where"] == "not loaded"
    names = [model["name"] for model in httpx.get(svc.base_url + "/api/ps", timeout=30).json()["models"]]
    assert f"{GEMMA}:latest" not in names


def test_the_trays_bar_and_menu_read_the_real_status(svc: ServiceHandle, model_path: Path) -> None:
    """The tray's Qt-free readers on this service's real status: the bar adds up to the device with a
    segment for the loaded library model, and each model gets a menu line."""
    from tray_app.view.budget_split import status_segments
    from tray_app.view.state import model_line

    ask(svc, GEMMA)
    status = svc.status()
    segments = status_segments(status)
    assert sum(segment.bytes for segment in segments) == status["plan"]["total_bytes"]
    gemma = next(segment for segment in segments if segment.label == GEMMA)
    assert gemma.bytes == model_status(svc, GEMMA)["vram_bytes"] > 0
    lines = [model_line(model) for model in status["models"]]
    assert lines[0].startswith(f"{model_path.name} · main") and lines[1].startswith(f"{GEMMA} · on the GPU")


def test_a_loaded_model_that_pressure_leaves_no_plan_is_still_counted_and_unloaded(
    svc: ServiceHandle,
) -> None:
    """Drill pressure re-plans: a model whose GPU plan no longer fits gets no new GPU requests, but its
    worker that runs still holds its memory: still shown, counted and unloaded by the library."""
    ask(svc, GEMMA)
    held = model_status(svc, GEMMA)["vram_bytes"]
    share = svc.status()["embeddings_plan"]["free_bytes"]
    taken = httpx.post(
        f"{svc.base_url}/failsoft/debug/pressure",
        # Just more than the share has room for beside the model: the model's own memory is on the ledger
        # too now, so more than that would not fit on the device at all.
        json={"take": str(share - held + held // 4), "label": "t"},
        timeout=30,
        headers=svc.headers(),
    )
    assert taken.status_code == 200, taken.text
    try:
        pressed = model_status(svc, GEMMA)
        assert pressed["plan"] is None  # no room for it any more: new requests take the ladder
        assert pressed["where"].startswith("gpu") and pressed["vram_bytes"] == held
        assert pressed["workers"]["gpu"] == f"gpu@{GEMMA}"
        stand_in = ask(svc, GEMMA).json()["failsoft"]
        assert stand_in["stand_in_for"] == GEMMA and stand_in["device"] == "gpu"
        assert unload(svc, GEMMA)["where"] == "not loaded"
        assert model_status(svc, GEMMA)["vram_bytes"] == 0
    finally:
        httpx.post(
            f"{svc.base_url}/failsoft/debug/pressure",
            json={"release": "t"},
            timeout=30,
            headers=svc.headers(),
        )
