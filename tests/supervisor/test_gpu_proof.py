"""A GPU worker on a real (not simulated) device must prove it is on a GPU: refused before it starts when the
build lists no GPU device, failed after load when llama.cpp's log shows no layers or weights on one. Here
the engine is a CPU build, so a real-GPU worker is refused for real, through the supervisor and llama-server;
the passing case runs on the fake llama-server printing a GPU build's load lines (a Vulkan build on Mesa's
lavapipe passed the same proof by hand: README, "A real GPU, honestly")."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.supervisor.conftest import Recorder, SupervisorFactory
from tests.support.fake_worker import fake_llama_server
from tray_app.config import SupervisorConfig
from tray_app.engine import binary, offload
from tray_app.engine.devices import DeviceListing
from tray_app.engine.llama_log import parse_buffer_sizes
from tray_app.engine.profile import WorkerProfile
from tray_app.supervisor import WorkerSupervisor

# llama.cpp's load lines on a CUDA build (src/llama-model.cpp, llama_model::load_tensors), as printed.
CUDA_LOAD = """\
0.00.214.371 I load_tensors: offloading output layer to GPU
0.00.214.372 I load_tensors: offloading 29 repeating layers to GPU
0.00.214.373 I load_tensors: offloaded 31/31 layers to GPU
0.00.214.380 I load_tensors:        CUDA0 model buffer size =    70.31 MiB
0.00.214.381 I load_tensors:   CPU_Mapped model buffer size =    21.79 MiB
"""
VULKAN_PARTIAL = """\
load_tensors: offloaded 10/31 layers to GPU
load_tensors:      Vulkan0 model buffer size =    23.44 MiB
load_tensors:  Vulkan_Host model buffer size =    68.66 MiB
"""
METAL = """\
load_tensors: offloaded 31/31 layers to GPU
load_tensors:  MTL0_Mapped model buffer size =    92.10 MiB
"""
# A CPU build prints no "offloaded" line; a GPU build asked for no layers prints 0/31 and host buffers.
CPU_BUILD = "load_tensors:   CPU_Mapped model buffer size =    92.10 MiB\n"
NOTHING_OFFLOADED = """\
load_tensors: offloaded 0/31 layers to GPU
load_tensors:    CUDA_Host model buffer size =    92.10 MiB
"""


def placement(log: str) -> offload.Offload:
    return offload.parse_offload(log, parse_buffer_sizes(log))


@pytest.mark.parametrize(
    ("log", "layers", "devices"), [(CUDA_LOAD, -1, ("CUDA0",)), (METAL, 31, ("MTL0_Mapped",))]
)
def test_layers_and_weights_on_a_gpu_pass(log: str, layers: int, devices: tuple[str, ...]) -> None:
    found = placement(log)
    assert found.devices == devices and found.layers == found.layers_total == 31
    assert offload.failure_after_load(found, layers) is None


def test_a_partial_offload_passes_when_it_is_the_plan() -> None:
    found = placement(VULKAN_PARTIAL)
    assert (found.layers, found.devices) == (10, ("Vulkan0",))
    assert offload.failure_after_load(found, 10) is None
    assert "offloaded 10/31 layers to GPU, 31 were planned" in str(offload.failure_after_load(found, -1))


def test_a_cpu_build_and_an_empty_offload_fail_with_what_to_do() -> None:
    cpu = offload.failure_after_load(placement(CPU_BUILD), -1)
    assert cpu is not None and "no GPU backend (CPU only)" in cpu and "make engine GPU_BACKEND=" in cpu
    none = offload.failure_after_load(placement(NOTHING_OFFLOADED), -1)
    assert none is not None and "offloaded 0/31 layers" in none


def test_host_buffers_alone_are_not_a_gpu() -> None:
    log = (
        "load_tensors: offloaded 31/31 layers to GPU\nload_tensors: CUDA_Host model buffer size = 92.10 MiB\n"
    )
    assert "no model buffer on a GPU device" in str(offload.failure_after_load(placement(log), -1))


def test_only_a_real_gpu_worker_with_layers_needs_proof() -> None:
    assert offload.needs_gpu_proof("gpu", simulated=False, n_gpu_layers=-1)
    assert offload.needs_gpu_proof("gpu-embed", simulated=False, n_gpu_layers=-1)
    assert not offload.needs_gpu_proof("gpu", simulated=True, n_gpu_layers=-1)
    assert not offload.needs_gpu_proof("cpu", simulated=False, n_gpu_layers=0)


def assert_never_a_gpu(status: dict[str, object], recorder: Recorder) -> None:
    assert status["state"] == "failed" and status["health"] == {}
    failure = status["last_failure"]
    assert isinstance(failure, dict) and failure["kind"] == "bad_config"
    assert not recorder.of_type("worker_state_changed", "gpu") or all(
        event.new != "ready"  # type: ignore[attr-defined]
        for event in recorder.of_type("worker_state_changed", "gpu")
    )


@pytest.mark.integration
async def test_a_real_gpu_worker_on_a_cpu_build_is_refused_before_it_starts(
    make_supervisor: SupervisorFactory, gpu_profile: WorkerProfile, recorder: Recorder
) -> None:
    real = dataclasses.replace(gpu_profile, simulated_vram_bytes=None, enable_faults=False)
    supervisor = make_supervisor(real)
    assert not await supervisor.start()
    status = supervisor.status()
    assert_never_a_gpu(status, recorder)
    message = status["last_failure"]["message"]
    assert "this llama.cpp build has no GPU backend (CPU only)" in message
    assert "make engine GPU_BACKEND=" in message and "--list-devices" in message
    assert supervisor.pid is None and supervisor.base_url is None
    assert not recorder.of_type("worker_restarted"), "a build without a GPU is not retried"


@pytest.mark.integration
async def test_a_build_that_lists_a_gpu_but_loads_on_the_cpu_fails_after_load(
    make_supervisor: SupervisorFactory,
    gpu_profile: WorkerProfile,
    recorder: Recorder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if the build listed a GPU device: the worker then starts, and its own load log must prove it.
    monkeypatch.setattr(offload, "refusal_before_start", lambda listing: None)
    real = dataclasses.replace(gpu_profile, simulated_vram_bytes=None, enable_faults=False)
    supervisor = make_supervisor(real)
    assert not await supervisor.start()
    status = supervisor.status()
    assert_never_a_gpu(status, recorder)
    message = status["last_failure"]["message"]
    # A CPU-only build prints no offload line; a build with llama.cpp's RPC backend (every engine's) prints
    # one, but its weights land in host buffers: either proof refuses the worker.
    assert "printed no 'offloaded N/M layers to GPU' line" in message or "only host buffers" in message
    assert supervisor.pid is None


@pytest.mark.integration
async def test_the_simulated_gpu_worker_is_unchanged(
    make_supervisor: SupervisorFactory, gpu_profile: WorkerProfile
) -> None:
    supervisor = make_supervisor(gpu_profile)
    assert await supervisor.start()
    health = supervisor.status()["health"]
    assert health["runs_on"] == "simulated" and health["simulated"]


def test_a_listing_with_a_gpu_is_not_refused() -> None:
    from tests.budget.test_engine_devices import CUDA, listing
    from tray_app.engine.devices import parse_device_list

    assert offload.refusal_before_start(parse_device_list(listing(CUDA))) is None
    assert "no GPU backend" in str(offload.refusal_before_start(DeviceListing(())))


async def real_gpu_worker(
    tmp_path: Path,
    gpu_profile: WorkerProfile,
    recorder: Recorder,
    settings: SupervisorConfig,
    **fake: str | int,
) -> WorkerSupervisor:
    """A GPU worker on a real (not simulated) device, run by the fake llama-server with a GPU build's load
    lines: the supervisor's proof reads them as it reads a real build's."""
    engine = binary.find(str(fake_llama_server(tmp_path, gpu="Vulkan0", **fake)))
    real = dataclasses.replace(gpu_profile, simulated_vram_bytes=None, enable_faults=False)
    return WorkerSupervisor(real, recorder.bus, settings, log_dir=tmp_path / "logs", engine=engine)


async def test_a_worker_whose_layers_land_on_the_gpu_passes_the_proof(
    gpu_profile: WorkerProfile, recorder: Recorder, fast_settings: SupervisorConfig, tmp_path: Path
) -> None:
    supervisor = await real_gpu_worker(tmp_path, gpu_profile, recorder, fast_settings)
    try:
        assert await supervisor.start(), supervisor.status()["reason"]
        health = supervisor.status()["health"]
        assert health["runs_on"] == "Vulkan0" and not health["simulated"]
        assert (health["offload"]["layers"], health["offload"]["layers_total"]) == (31, 31)
    finally:
        await supervisor.aclose()


async def test_a_worker_with_layers_left_on_the_cpu_is_refused_with_the_count(
    gpu_profile: WorkerProfile, recorder: Recorder, fast_settings: SupervisorConfig, tmp_path: Path
) -> None:
    supervisor = await real_gpu_worker(tmp_path, gpu_profile, recorder, fast_settings, placed=10)
    try:
        assert not await supervisor.start()
        failure = supervisor.last_failure
        assert failure is not None and failure["kind"] == "bad_config"
        assert "offloaded 10/31 layers to GPU, 31 were planned" in failure["message"]
        assert supervisor.state != "ready"  # never shown, counted or routed to as a GPU
    finally:
        await supervisor.aclose()
