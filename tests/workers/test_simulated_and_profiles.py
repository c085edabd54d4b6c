"""Pure parts of the simulated GPU, fault injection and worker profiles."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest

from tray_app import config
from tray_app.budget import PlanSet, cpu_request, physical_cores, plan_from_config
from tray_app.llama_log import BufferSizes
from tray_app.planner import plan_cpu
from tray_app.supervisor import profiles_from_plans
from tray_app.worker import simulated
from tray_app.worker.args import parse_args
from tray_app.worker.faults import FaultInjector

MIB = 1024 * 1024
BUFFERS = BufferSizes(model_bytes=90 * MIB, kv_bytes=12 * MIB, compute_bytes=98 * MIB, output_bytes=MIB // 4)


@pytest.mark.parametrize(
    ("free_mib", "message", "line"),
    [
        (64, "Failed to load model from file", "unable to allocate CUDA0 buffer"),
        (95, "Failed to create llama_context", "failed to allocate buffer for kv cache"),
        (150, "Failed to create llama_context", "failed to allocate compute buffers"),
    ],
)
def test_first_buffer_that_does_not_fit_fails_like_cuda(free_mib: int, message: str, line: str) -> None:
    allocation = simulated.device_share(BUFFERS, n_gpu_layers=-1, n_layers=31)
    failure = simulated.failure_for(allocation, free_mib * MIB, Path("m.gguf"))
    assert failure is not None
    lines, error = failure
    assert error.startswith(message)
    assert "cudaMalloc failed: out of memory (simulated)" in lines[0]
    assert any(line in text for text in lines)


def test_everything_fits_in_a_large_simulated_gpu() -> None:
    allocation = simulated.device_share(BUFFERS, n_gpu_layers=-1, n_layers=31)
    assert simulated.failure_for(allocation, 4096 * MIB, Path("m.gguf")) is None


def test_layers_left_on_the_cpu_do_not_count_against_vram() -> None:
    none_offloaded = simulated.device_share(BUFFERS, n_gpu_layers=0, n_layers=31)
    assert none_offloaded.total_bytes == 0
    half = simulated.device_share(BUFFERS, n_gpu_layers=15, n_layers=30)
    assert half.model_bytes == 45 * MIB and half.kv_bytes == 6 * MIB


def test_raise_out_of_memory_prints_the_lines_and_raises_the_plain_value_error() -> None:
    stream = io.StringIO()
    with pytest.raises(ValueError, match=r"^Failed to create llama_context$") as raised:
        simulated.raise_out_of_memory(["line one (simulated)"], "Failed to create llama_context", stream)
    assert type(raised.value) is ValueError
    assert stream.getvalue() == "line one (simulated)\n"


class FakeLlama:
    """Stands in for llama_cpp.Llama's two methods the injector wraps (pure logic test)."""

    def __init__(self) -> None:
        self.decoded: list[list[int]] = []

    def eval(self, tokens: list[int]) -> None:
        self.decoded.append(list(tokens))

    def sample(self) -> int:
        return 7


def test_oom_decode_fires_once_after_n_generated_tokens() -> None:
    injector = FaultInjector()
    llama = FakeLlama()
    injector.attach(llama)
    injector.arm("oom_decode", after_tokens=2)
    llama.eval([1, 2, 3])  # the prompt
    llama.sample()
    llama.eval([7])  # first token decoded
    llama.sample()  # second token generated: the next decode fails
    with pytest.raises(RuntimeError, match=r"^llama_decode returned -2$"):
        llama.eval([7])
    llama.eval([7])  # one-shot: the next decode works
    assert injector.armed() is None
    assert len(llama.decoded) == 3


def test_unknown_fault_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fault kind"):
        FaultInjector().arm("meltdown", 0)


def test_worker_refuses_fault_flags_without_enable_faults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--model", "m.gguf", "--role", "gpu", "--port", "1", "--fault-load-oom"])
    assert exited.value.code == 2
    assert "--fault-load-oom needs --enable-faults" in capsys.readouterr().err


@pytest.fixture(scope="module")
def planned(model_path: Path) -> tuple[config.Config, PlanSet]:
    """One real plan (device probe, GGUF inspection) shared by the profile tests: it takes seconds."""
    cfg = config.from_dict({"device": {"simulate_vram": "4GiB"}, "model": {"path": str(model_path)}})
    return cfg, plan_from_config(cfg)


def test_profiles_follow_the_plans(planned: tuple[config.Config, PlanSet]) -> None:
    cfg, plans = planned
    profiles = profiles_from_plans(cfg, plans)
    assert profiles.gpu is not None and profiles.cpu is not None
    gpu, cpu = profiles.gpu, profiles.cpu
    assert (gpu.n_ctx, gpu.n_gpu_layers) == (plans.gpu.n_ctx, plans.gpu.n_gpu_layers)
    assert gpu.simulated_vram_bytes == plans.device.free_bytes
    assert cpu.n_gpu_layers == 0 and cpu.n_ctx == plans.cpu.n_ctx
    assert cpu.simulated_vram_bytes is None
    # Beside a simulated GPU the two workers share the cores instead of each taking all of them.
    assert gpu.n_threads + cpu.n_threads == max(physical_cores(), 2)
    assert gpu.n_threads >= 1 and cpu.n_threads >= 1
    assert cpu.warm == plans.cpu.fits
    assert not gpu.enable_faults and "--enable-faults" not in gpu.worker_args(port=1234, parent_pid=None)
    args = gpu.worker_args(port=1234, parent_pid=42)
    parsed = parse_args(args)
    assert (parsed.port, parsed.parent_pid, parsed.n_ctx) == (1234, 42, gpu.n_ctx)
    assert parsed.n_ubatch == plans.gpu.n_ubatch and parsed.n_gpu_layers == plans.gpu.n_gpu_layers
    assert parsed.simulated_vram_bytes == plans.device.free_bytes


def test_cpu_worker_is_on_demand_when_ram_does_not_allow_it(planned: tuple[config.Config, PlanSet]) -> None:
    cfg, plans = planned
    # A reserve of (almost) all RAM leaves nothing for the CPU worker.
    greedy = dataclasses.replace(cfg, cpu=dataclasses.replace(cfg.cpu, reserve_percent=99.9))
    no_room = dataclasses.replace(plans, cpu=plan_cpu(plans.ram, plans.model, cpu_request(greedy)))
    assert not no_room.cpu.fits
    profiles = profiles_from_plans(greedy, no_room)
    assert profiles.cpu is not None and not profiles.cpu.warm
    assert "on demand" in profiles.cpu.warm_reason
    assert any("on demand" in note for note in profiles.notes)


def test_faults_only_when_asked(planned: tuple[config.Config, PlanSet]) -> None:
    cfg, plans = planned
    profiles = profiles_from_plans(cfg, plans, enable_faults=True)
    assert profiles.gpu is not None and profiles.gpu.enable_faults and not profiles.gpu.fault_load_oom
    assert "--enable-faults" in profiles.gpu.worker_args(port=1, parent_pid=None)
