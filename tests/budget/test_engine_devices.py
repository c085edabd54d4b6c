"""llama.cpp's own device list (`llama-server --list-devices`): the parser on the format each backend prints
(common/arg.cpp, common_print_available_devices), the installed binary for real, and the device a plan is
said to be for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tray_app.budget.device import DeviceMemory, no_gpu
from tray_app.budget.target import plan_target
from tray_app.engine import binary
from tray_app.engine.devices import DeviceListError, is_gpu_buffer, list_devices, parse_device_list

MIB = 1024**2
FAILSOFT = Path(sys.executable).parent / "failsoft"

# One line per backend as llama.cpp prints it: "  %s: %s (%zu MiB, %zu MiB free)", name, description.
CUDA = "  CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23500 MiB free)"
VULKAN = "  Vulkan0: AMD Radeon RX 7900 XTX (RADV NAVI31) (24560 MiB, 24000 MiB free)"
LAVAPIPE = "  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (24049 MiB, 24049 MiB free)"
ROCM = "  ROCm0: AMD Radeon RX 7900 XTX (24560 MiB, 24472 MiB free)"
METAL = "  MTL0: Apple M2 Max (49152 MiB, 49151 MiB free)"
BLAS = "  BLAS: OpenBLAS (0 MiB, 0 MiB free)"


def listing(*lines: str) -> str:
    return "\n".join(["Available devices:", *lines]) + "\n"


@pytest.mark.parametrize(
    ("line", "name", "backend", "index", "description", "total_mib", "free_mib"),
    [
        (CUDA, "CUDA0", "cuda", 0, "NVIDIA GeForce RTX 4090", 24080, 23500),
        (VULKAN, "Vulkan0", "vulkan", 0, "AMD Radeon RX 7900 XTX (RADV NAVI31)", 24560, 24000),
        (LAVAPIPE, "Vulkan0", "vulkan", 0, "llvmpipe (LLVM 15.0.6, 256 bits)", 24049, 24049),
        (ROCM, "ROCm0", "hip", 0, "AMD Radeon RX 7900 XTX", 24560, 24472),
        (METAL, "MTL0", "metal", 0, "Apple M2 Max", 49152, 49151),
    ],
)
def test_each_backends_device_line_is_read(
    line: str, name: str, backend: str, index: int, description: str, total_mib: int, free_mib: int
) -> None:
    (device,) = parse_device_list(listing(line)).devices
    assert (device.name, device.backend, device.index, device.description) == (
        name,
        backend,
        index,
        description,
    )
    assert (device.total_bytes, device.free_bytes) == (total_mib * MIB, free_mib * MIB)
    assert device.is_gpu


def test_several_gpus_and_an_accelerator_that_is_not_one() -> None:
    text = "ggml_cuda_init: found 2 CUDA devices:\n" + listing(
        CUDA, "  CUDA1: NVIDIA RTX A6000 (48541 MiB, 48000 MiB free)", BLAS
    )
    found = parse_device_list(text)
    assert [d.name for d in found.devices] == ["CUDA0", "CUDA1", "BLAS"]
    assert [d.name for d in found.gpus] == ["CUDA0", "CUDA1"] and found.backends == ("cuda",)


def test_a_cpu_only_build_lists_none() -> None:
    found = parse_device_list(listing("  (none)"))
    assert found.devices == () and found.gpus == () and found.backends == ()


def test_output_without_the_list_is_an_error() -> None:
    with pytest.raises(DeviceListError, match="Available devices"):
        parse_device_list("error: invalid argument: --list-devices\n")


@pytest.mark.parametrize(
    ("name", "on_gpu"),
    [
        ("CUDA0", True),
        ("ROCm1", True),
        ("Vulkan0", True),
        ("MTL0_Mapped", True),
        ("MTL0", True),
        ("CUDA_Split", True),
        ("CUDA_Host", False),
        ("Vulkan_Host", False),
        ("CPU", False),
        ("CPU_Mapped", False),
        ("CPU_REPACK", False),
    ],
)
def test_buffer_names_on_a_gpu_device(name: str, on_gpu: bool) -> None:
    assert is_gpu_buffer(name) is on_gpu


def test_the_installed_cpu_build_lists_no_gpu() -> None:
    found = list_devices(binary.find("").path)
    assert found.gpus == (), f"this machine's engine is a CPU build, yet it lists {found.gpus}"


def nvidia(name: str = "NVIDIA GeForce RTX 4090") -> DeviceMemory:
    return DeviceMemory(name, "nvidia", 24 * 1024 * MIB, 23 * 1024 * MIB, 0, simulated=False, reason="NVML")


def test_a_card_the_build_cannot_use_is_planned_as_cpu_only_with_the_fix() -> None:
    target = plan_target(nvidia(), parse_device_list(listing("  (none)")))
    assert (target.kind, target.label, target.backend) == ("cpu", "CPU only", "")
    assert "has no GPU backend" in target.reason and "make engine GPU_BACKEND=" in target.reason


def test_a_card_the_build_lists_is_named_with_its_backend() -> None:
    target = plan_target(nvidia(), parse_device_list(listing(CUDA)))
    assert (target.kind, target.backend, target.device) == ("gpu", "cuda", "CUDA0")
    assert target.label == "CUDA0 (NVIDIA GeForce RTX 4090), cuda"


def test_a_gpu_without_nvml_is_not_planned_as_one() -> None:
    target = plan_target(no_gpu("no NVIDIA GPU"), parse_device_list(listing(METAL)))
    assert target.kind == "cpu" and "MTL0 (Apple M2 Max)" in target.reason


def test_simulated_and_unknown() -> None:
    simulated = DeviceMemory("simulated GPU", "simulated", 4 * 1024 * MIB, 4 * 1024 * MIB, 0, simulated=True)
    assert plan_target(simulated, None).label == "simulated (no GPU)"
    unknown = plan_target(no_gpu("none"), None, "no such file")
    assert unknown.kind == "unknown" and unknown.reason == "no such file"


def failsoft_plan(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FAILSOFT_DATA_DIR": str(tmp_path / "data")}
    return subprocess.run(
        [str(FAILSOFT), "plan", *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_failsoft_plan_says_which_device_it_plans_against(tmp_path: Path) -> None:
    simulated = failsoft_plan("--simulate-vram", "4GiB", tmp_path=tmp_path)
    assert simulated.returncode == 0, simulated.stderr
    assert "plans against: simulated (no GPU)" in simulated.stdout
    plain = failsoft_plan("--json", tmp_path=tmp_path)
    assert plain.returncode == 0, plain.stderr
    target = json.loads(plain.stdout)["target"]
    # No GPU here: NVML finds no card and the CPU build lists no device.
    assert (target["kind"], target["label"]) == ("cpu", "CPU only")
