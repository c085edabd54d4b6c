"""The devices llama.cpp itself can use, from `llama-server --list-devices`.

NVML says a card is in the machine; only llama.cpp says whether the build can use it. `--list-devices`
(common/arg.cpp, common_print_available_devices) loads every backend and prints each non-CPU device:

    Available devices:
      CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23500 MiB free)

and `  (none)` when there is none, as on a CPU-only build. The device name is the backend's prefix and an
index (ggml-cuda: "CUDA", or "ROCm"/"MUSA" when ggml-cuda is built for HIP/MUSA; ggml-vulkan "Vulkan";
ggml-metal "MTL"; ggml-sycl "SYCL"; ggml-cann "CANN"; ggml-opencl "GPUOpenCL" with no index). Non-CPU is not
the same as GPU: BLAS is an accelerator of the CPU, RPC a device on another machine.
"""

from __future__ import annotations

import functools
import re
import socket
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tray_app.config.peers import split_endpoint

MIB = 1024 * 1024
# Device-name prefix -> the backend as a user names it (GPU_BACKEND values where there is one).
GPU_BACKENDS = {
    "CUDA": "cuda",
    "ROCm": "hip",
    "MUSA": "musa",
    "Vulkan": "vulkan",
    "MTL": "metal",
    "SYCL": "sycl",
    "CANN": "cann",
    "GPUOpenCL": "opencl",
}
_HEADER = "Available devices:"
_DEVICE_LINE = re.compile(
    r"^\s+(?P<name>[A-Za-z][\w.\-\[\]:]*?)(?P<index>\d*): (?P<description>.*) "
    r"\((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$"
)
_NAME = re.compile(r"^(?P<prefix>[A-Za-z]+?)(?P<index>\d*)(?:_(?P<suffix>\w+))?$")


@dataclass(frozen=True)
class LlamaDevice:
    """One device as llama.cpp lists it."""

    name: str  # llama.cpp's device name, e.g. "CUDA0", "Vulkan1", "MTL0"
    prefix: str  # the backend's part of the name: "CUDA", "Vulkan", "MTL"
    index: int | None  # None where the backend names its device without one (GPUOpenCL)
    description: str  # e.g. "NVIDIA GeForce RTX 4090"
    total_bytes: int
    free_bytes: int

    @property
    def backend(self) -> str:
        """The backend in the build's words ("cuda", "vulkan", "hip", "metal"), else the prefix as printed."""
        return GPU_BACKENDS.get(self.prefix, self.prefix)

    @property
    def is_gpu(self) -> bool:
        return self.prefix in GPU_BACKENDS

    def label(self) -> str:
        return f"{self.name} ({self.description})"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "backend": self.backend, "is_gpu": self.is_gpu}


@dataclass(frozen=True)
class DeviceListing:
    devices: tuple[LlamaDevice, ...]

    @property
    def gpus(self) -> tuple[LlamaDevice, ...]:
        return tuple(device for device in self.devices if device.is_gpu)

    @property
    def backends(self) -> tuple[str, ...]:
        """The GPU backends of the build, in the order their devices were listed."""
        return tuple(dict.fromkeys(device.backend for device in self.gpus))

    def to_dict(self) -> dict[str, Any]:
        return {"devices": [device.to_dict() for device in self.devices], "backends": list(self.backends)}


class DeviceListError(RuntimeError):
    """`--list-devices` could not run or printed something that is not a device list."""


def parse_device_list(text: str) -> DeviceListing:
    """The devices in `llama-server --list-devices` output (backends may log other lines around it)."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == _HEADER)
    except StopIteration:
        raise DeviceListError(f"no {_HEADER!r} line in the output") from None
    devices = []
    for line in lines[start + 1 :]:
        match = _DEVICE_LINE.match(line)
        if match is None:
            continue  # "  (none)", or a backend's own log line
        index = match["index"]
        devices.append(
            LlamaDevice(
                name=match["name"] + index,
                prefix=match["name"],
                index=int(index) if index else None,
                description=match["description"],
                total_bytes=int(match["total"]) * MIB,
                free_bytes=int(match["free"]) * MIB,
            )
        )
    return DeviceListing(tuple(devices))


def is_gpu_buffer(buffer_name: str) -> bool:
    """Whether a llama.cpp buffer lives on a GPU device: "CUDA0", "Vulkan0", "ROCm1", "MTL0_Mapped",
    "CUDA_Split" do; "CPU", "CPU_Mapped", "CUDA_Host" (pinned host memory), "Vulkan_Host" do not."""
    match = _NAME.match(buffer_name)
    if match is None or match["prefix"] not in GPU_BACKENDS:
        return False
    return match["suffix"] != "Host"


def _run(binary: Path) -> str:
    try:
        done = subprocess.run(
            [str(binary), "--list-devices"],
            capture_output=True,
            text=True,
            timeout=60,  # a GPU backend initialises its driver first; seconds on a busy machine
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DeviceListError(f"{binary} --list-devices could not run: {error}") from error
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise DeviceListError(f"{binary} --list-devices exited {done.returncode}: {' / '.join(tail)}")
    return done.stdout


@functools.lru_cache(maxsize=8)
def _listed(binary: Path, _mtime_ns: int) -> DeviceListing:
    return parse_device_list(_run(binary))


def list_devices(binary: Path) -> DeviceListing:
    """What `binary --list-devices` prints, read once per file version (devices do not come and go; their
    free memory here is as of that first reading, so NVML stays the source for live usage)."""
    try:
        mtime = binary.stat().st_mtime_ns
    except OSError as error:
        raise DeviceListError(f"{binary}: {error}") from error
    return _listed(binary, mtime)


RPC_PREFIX = "RPC"  # llama.cpp's RPC backend: a device on another machine
RPC_LIST_TIMEOUT_S = 15.0
RPC_CONNECT_TIMEOUT_S = 3.0  # llama.cpp's own connect waits for the system's timeout: minutes on a LAN


def rpc_device(binary: Path, endpoint: str, timeout: float = RPC_LIST_TIMEOUT_S) -> LlamaDevice:
    """The device `failsoft rpc serve` offers at `endpoint` (host:port), as this build of llama-server lists
    it with `--rpc` (its memory is the other machine's, read now); DeviceListError saying why when it does
    not answer. Not cached: a box on the LAN comes and goes."""
    try:
        socket.create_connection(split_endpoint(endpoint), timeout=RPC_CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as error:
        raise DeviceListError(f"the RPC server at {endpoint} does not answer: {error}") from error
    try:
        done = subprocess.run(
            # --rpc first: --list-devices prints the devices known when it is read, and exits.
            [str(binary), "--rpc", endpoint, "--list-devices"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as error:
        raise DeviceListError(
            f"the RPC server at {endpoint} took the connection but did not answer within "
            f"{timeout:.0f} s: it serves one client at a time (a GPU worker using it now?)"
        ) from error
    except OSError as error:
        raise DeviceListError(f"{binary} --rpc {endpoint} --list-devices could not run: {error}") from error
    remote = [device for device in parse_device_list(done.stdout).devices if device.prefix == RPC_PREFIX]
    if done.returncode != 0 or not remote:
        tail = " / ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
        raise DeviceListError(f"llama.cpp lists no device at {endpoint} (exit {done.returncode}): {tail}")
    return remote[0]
