"""Start `failsoft serve --enable-faults` as a subprocess for a drill or a benchmark; stop it leaving nothing.

The service runs from a temporary directory (its own config, journal and logs), so a drill never touches the
user's journal. Its config is the user's effective config with the changes a drill needs (see `drill_config`).
"""

from __future__ import annotations

import contextlib
import copy
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import tomli_w

from tray_app.config import Config, from_dict
from tray_app.host.launch import ServeProcess, spawn_serve, stop_process_tree, workers_ready
from tray_app.library.catalog import catalog_from_config

READY_TIMEOUT = 180.0
# The drill's GPU slots get a small context and the CPU's larger ones, so that a request can exceed the GPU
# profile while still fitting in RAM (scenarios a and b): 4 slots of 512 tokens, 4 of 2048.
DRILL_SLOTS = 4
DRILL_GPU_MAX_CTX = 512 * DRILL_SLOTS
DRILL_CPU_MAX_CTX = 2048 * DRILL_SLOTS
# Scenario l's own service: a conversation of about 2,000 tokens and its answer in one slot, GPU and CPU.
LONG_SLOTS = 2
LONG_SLOT_CTX = 2560
LONG_HEALTH_TIMEOUT = 10.0  # also the mirror bench's; the first token's deadline follows from it
# Quick failure detection, so a hung or crashed GPU worker is found within about a second.
DRILL_SUPERVISOR = {
    "health_interval": 0.5,
    "health_timeout": 1.0,
    "backoff_initial": 0.2,
    "stable_after": 1.0,
}

# Scenarios h to j need a library model with a stand-in and a second library model. When the config names no
# model with a stand-in, the drill adds two: the main model's own GGUF under other names (the drill checks
# routing, not answers), each with an explicit context so its plan is predictable. One library model loaded
# on the GPU at a time, so that loading a second one must unload the first (scenario j).
DRILL_BIG = "drill-big"
DRILL_OTHER = "drill-other"
DRILL_MODEL_CTX = 1024
DRILL_MAX_LOADED = 1
DRILL_RETURN_AFTER = 2.0


class LaunchError(RuntimeError):
    """The service did not come up; the message carries what it printed."""


def drill_config(cfg: Config, simulate_vram: str | None) -> dict[str, Any]:
    """The user's config with what a drill needs: faults allowed by the command line, a GPU context smaller
    than the CPU's, fast health checks, automatic fallback with resumed streams, loopback only, stand-ins
    allowed, one library model on the GPU at a time, and library models for the ladder (`drill_models`)."""
    data = cfg.to_dict()
    if simulate_vram:
        data["device"]["simulate_vram"] = simulate_vram
    data["budget"].update(n_ctx=0, max_ctx=DRILL_GPU_MAX_CTX, n_parallel=DRILL_SLOTS)
    data["cpu"].update(enabled=True, warm=True, n_ctx=0, max_ctx=DRILL_CPU_MAX_CTX, n_parallel=DRILL_SLOTS)
    data["server"].update(host="127.0.0.1", api_key="", queue_timeout=120.0)
    data["failover"].update(fallback="auto", stream_after_content="resume", deadline=120.0)
    data["supervisor"].update(DRILL_SUPERVISOR)
    data["library"].update(stand_in="auto", max_loaded=DRILL_MAX_LOADED)
    data["gpu"].update(return_after=DRILL_RETURN_AFTER)  # k: the GPU back soon after the hog exits
    data["models"] = [*drill_models(cfg), *data["models"]]  # first: the scenarios take the first that fit
    # Fails here, with the key or model named, rather than in the child.
    catalog_from_config(from_dict(data, source="drill config"))
    return data


def long_slot_config(settings: dict[str, Any]) -> dict[str, Any]:
    """The drill's config with GPU and CPU slots long enough for a conversation of about 2,000 tokens
    (scenario l)."""
    data = copy.deepcopy(settings)
    data["budget"].update(max_ctx=LONG_SLOT_CTX * LONG_SLOTS, n_parallel=LONG_SLOTS)
    data["cpu"].update(max_ctx=LONG_SLOT_CTX * DRILL_SLOTS, n_parallel=DRILL_SLOTS)
    # A simulated GPU reads a long prompt at CPU speed, beside the mirror's reading: on a busy machine its
    # /health can take more than the drill's 1 s. l kills its worker outright, which is seen at once anyway.
    data["supervisor"]["health_timeout"] = LONG_HEALTH_TIMEOUT
    return data


def drill_models(cfg: Config) -> list[dict[str, Any]]:
    """The library models the drill adds to `cfg`'s for scenarios h to j: none when the config already has
    a model with a stand-in (that may use the GPU) and a second one; else `drill-big` (its stand-in the main
    model) and/or `drill-other`, both the main model's GGUF."""
    main = cfg.model_path()
    taken = {cfg.model_name(), main.name, main.stem, str(main), "default"}
    for model in cfg.models:
        taken |= {model.name, *model.aliases}
    big = next(
        (model for model in cfg.models if model.stand_in and "gpu" in model.devices and model.name), None
    )
    others = [
        model
        for model in cfg.models
        if big is not None and model is not big and model.name != big.stand_in and "gpu" in model.devices
    ]
    added: list[dict[str, Any]] = []
    if big is None:
        added.append(_drill_model(_free_name(DRILL_BIG, taken), str(main), stand_in=main.name))
    if not others:
        added.append(_drill_model(_free_name(DRILL_OTHER, taken), str(main)))
    return added


def _drill_model(name: str, path: str, stand_in: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "path": path,
        "n_ctx": DRILL_MODEL_CTX,
        "n_parallel": 1,
        "devices": ["gpu", "cpu"],
        "stand_in": stand_in,
        "keep_alive": "-1",  # only the drill unloads them (or the eviction rule)
    }


def _free_name(base: str, taken: set[str]) -> str:
    name, number = base, 1
    while name in taken:
        number += 1
        name = f"{base}-{number}"
    taken.add(name)
    return name


def service_status(base_url: str, api_key: str = "") -> dict[str, Any] | None:
    """`GET /failsoft/status` of the service at `base_url` (with its API key, when it has one); None while it
    does not answer."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        response = httpx.get(base_url + "/failsoft/status", headers=headers, timeout=5)
        response.raise_for_status()
        data: dict[str, Any] = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    return data


def _wait_ready(service: ServeProcess, timeout: float, api_key: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            raise LaunchError(f"failsoft serve exited with {service.process.returncode}:\n{service.output()}")
        if workers_ready(service_status(service.base_url, api_key)):
            return
        time.sleep(0.2)
    raise LaunchError(f"the service's workers were not ready after {timeout:.0f}s:\n{service.output()}")


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM ends this process through its `finally` blocks (so the service it started is stopped too)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def launched_service(
    settings: dict[str, Any], *, ready_timeout: float = READY_TIMEOUT
) -> Iterator[ServeProcess]:
    """Run `failsoft serve --enable-faults` with `settings` as its config on a free loopback port; yields once
    its workers are ready and stops it (workers included) on exit."""
    with tempfile.TemporaryDirectory(prefix="failsoft-drill-") as tmp:
        root = Path(tmp)
        config_path = root / "config.toml"
        config_path.write_text(tomli_w.dumps(settings), encoding="utf-8")
        service = spawn_serve(root, config_path, args=["--enable-faults"])
        try:
            with _terminate_as_exit():
                # A service with an API key (a drill's peer) answers its status only with it.
                _wait_ready(service, ready_timeout, str(settings["server"].get("api_key") or ""))
                yield service
        finally:
            stop_process_tree(service.process)
