"""Pure parts of the simulated GPU, fault arming, the llama-server command line and worker profiles."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.support.tiny_moe import write_tiny_moe
from tray_app import config
from tray_app.budget.model_info import inspect_model
from tray_app.budget.plan_set import PlanSet, cpu_request, physical_cores, plan_from_config
from tray_app.budget.planner import plan_cpu
from tray_app.engine import simulated
from tray_app.engine.argv import llama_server_argv, worker_env
from tray_app.engine.faults import check_fault
from tray_app.engine.llama_log import BufferSizes
from tray_app.engine.profile import WorkerProfile
from tray_app.supervisor import launch_plan, profiles_from_plans
from tray_app.supervisor.failed_allocation import failed_allocation

MIB = 1024 * 1024
BUFFERS = BufferSizes(model_bytes=90 * MIB, kv_bytes=12 * MIB, compute_bytes=98 * MIB, output_bytes=MIB // 4)


@pytest.mark.parametrize(
    ("free_mib", "line"),
    [
        (64, "unable to allocate CUDA0 buffer"),
        (95, "failed to allocate buffer for kv cache"),
        (150, "failed to allocate compute buffers"),
    ],
)
def test_first_buffer_that_does_not_fit_fails_like_cuda(free_mib: int, line: str) -> None:
    allocation = simulated.device_share(BUFFERS, n_gpu_layers=-1, n_layers=31)
    lines = simulated.failure_lines(allocation, free_mib * MIB)
    assert lines is not None
    assert "cudaMalloc failed: out of memory (simulated)" in lines[-3]
    assert line in lines[-1] and lines[-1].endswith("(simulated)")
    # What a retry holds back: the buffers allocated before, and the one that failed, beyond what was free.
    reached = failed_allocation(lines, simulated=True)
    assert reached is not None and reached.reached_bytes > free_mib * MIB
    assert reached.reached_bytes - reached.failed_bytes <= free_mib * MIB


def test_everything_fits_in_a_large_simulated_gpu() -> None:
    allocation = simulated.device_share(BUFFERS, n_gpu_layers=-1, n_layers=31)
    assert simulated.failure_lines(allocation, 4096 * MIB) is None


def test_layers_left_on_the_cpu_do_not_count_against_vram() -> None:
    none_offloaded = simulated.device_share(BUFFERS, n_gpu_layers=0, n_layers=31)
    assert none_offloaded.total_bytes == 0
    half = simulated.device_share(BUFFERS, n_gpu_layers=15, n_layers=30)
    assert half.model_bytes == 45 * MIB and half.kv_bytes == 6 * MIB


def test_experts_kept_in_ram_do_not_count_against_vram() -> None:
    """A CPU build prints every weight in one buffer; an expert split's experts in RAM are not the GPU's."""
    split = simulated.device_share(BUFFERS, n_gpu_layers=-1, n_layers=31, experts_in_ram=40 * MIB)
    assert split.model_bytes == 50 * MIB and split.kv_bytes == 12 * MIB
    assert simulated.failure_lines(split, 165 * MIB) is None  # 50 + 12 + 0.25 + 98 MiB
    whole = simulated.device_share(BUFFERS, n_gpu_layers=-1, n_layers=31)
    assert simulated.failure_lines(whole, 165 * MIB) is not None


def test_memory_limit_leaves_room_for_the_simulated_vram_only() -> None:
    four_gib = simulated.address_space_limit(4096 * MIB)
    assert four_gib == simulated.BASELINE_BYTES + 4096 * MIB + simulated.MARGIN_BYTES
    assert simulated.address_space_limit(4096 * MIB, load_fault=True) < simulated.BASELINE_BYTES


def test_the_memory_limit_also_holds_what_the_plan_keeps_in_ram(tmp_path: Path) -> None:
    """A split's layers or experts in RAM live in the worker process beside the simulated VRAM."""
    model = write_tiny_moe(tmp_path / "tiny-moe.gguf")
    info = inspect_model(model)
    split = WorkerProfile(
        role="gpu",
        model_path=model,
        n_ctx=1024,
        n_gpu_layers=9,
        n_threads=1,
        n_cpu_moe=3,
        cpu_expert_tensors=("ffn_down_exps",),
        simulated_vram_bytes=4 * MIB,
    )
    launch = launch_plan.prepare(Path("/opt/llama-server"), split, 1, "key")
    assert isinstance(launch, launch_plan.Launch)
    in_ram = 3 * info.expert_layer_bytes[0] + dict(info.expert_tensors[3])["ffn_down_exps"] + info.input_bytes
    assert launch_plan.load_check.ram_weights_bytes(split) == in_ram
    assert launch.memory_limit == simulated.address_space_limit(4 * MIB + in_ram)


def test_faults_are_checked_when_armed() -> None:
    assert check_fault("abort", 3).to_dict() == {"kind": "abort", "after_tokens": 3}
    with pytest.raises(ValueError, match="unknown fault kind 'oom_decode'"):
        check_fault("oom_decode", 0)  # llama-server has no trigger for it (see tray_app.engine.faults)
    with pytest.raises(ValueError, match=">= 0"):
        check_fault("hang", -1)


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
    assert not gpu.enable_faults
    argv = llama_server_argv(Path("/opt/llama-server"), gpu, port=1234)
    flags = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert argv[0] == "/opt/llama-server" and "--no-webui" in argv and "--jinja" in argv
    assert (flags["--port"], flags["--host"], flags["--fit"]) == ("1234", "127.0.0.1", "off")
    # Every number the planner chose, passed explicitly: -c is the total over the slots.
    assert flags["--ctx-size"] == str(plans.gpu.n_ctx) and flags["--parallel"] == str(plans.gpu.n_parallel)
    assert flags["--ubatch-size"] == str(plans.gpu.n_ubatch)
    assert flags["--n-gpu-layers"] == str(plans.gpu.n_gpu_layers)
    # An HTTP thread for each slot, the health probe, the router's spare connection and a control call.
    assert flags["--threads-http"] == str(plans.gpu.n_parallel + 3)
    assert "--load-mode" in argv  # a simulated device: weights in real allocations under the limit
    # The worker calls the model by the name clients know it by, never by its file path.
    assert argv[argv.index("--alias") + 1] == cfg.model_path().name == gpu.model_name == cpu.model_name
    cpu_argv = llama_server_argv(Path("/opt/llama-server"), cpu, port=1)
    assert "--load-mode" not in cpu_argv
    # The CPU worker sees no GPU, whatever the build: no device for the model, none in its environment.
    assert "--device" not in argv and cpu_argv[cpu_argv.index("--device") + 1] == "none"
    # The CPU worker's prompt cache is the planner's (what the CPU mirror fills); the GPU worker's is not set.
    assert cpu_argv[cpu_argv.index("--cache-ram") + 1] == str(plans.cpu.prompt_cache_bytes // 1024**2)
    assert "--cache-ram" not in argv
    assert worker_env(cpu)["CUDA_VISIBLE_DEVICES"] == "" and "CUDA_VISIBLE_DEVICES" not in worker_env(gpu)


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
    assert profiles.cpu is not None and profiles.cpu.enable_faults


def test_the_gpu_embeddings_worker_lives_in_what_the_chat_plan_leaves_free(
    planned: tuple[config.Config, PlanSet], model_path: Path
) -> None:
    """The embeddings worker on the GPU is planned (all its layers, its context) in the chat plan's free
    share, never in its reserve; when it does not fit there, embeddings run on the CPU only, and say so."""
    cfg, plans = planned
    embeddings = plans.embeddings
    assert embeddings is not None and embeddings.fits and embeddings.n_gpu_layers == embeddings.n_layers
    assert embeddings.used_bytes <= plans.gpu.free_bytes and embeddings.n_ctx == cfg.embeddings.n_ctx
    by_role = profiles_from_plans(cfg, plans).by_role()
    gpu_embed, cpu_embed = by_role["gpu-embed"], by_role["cpu-embed"]
    assert (gpu_embed.pooling, gpu_embed.n_ctx, gpu_embed.warm) == ("mean", cfg.embeddings.n_ctx, False)
    assert gpu_embed.simulated_vram_bytes == plans.gpu.free_bytes  # not the whole card
    assert cpu_embed.n_gpu_layers == 0 and cpu_embed.simulated_vram_bytes is None

    # A card the chat plan fills (no max_ctx to stop it): nothing is left for a second copy of the model.
    full = config.from_dict(
        {
            "device": {"simulate_vram": "600MiB"},
            "model": {"path": str(model_path)},
            "budget": {"max_ctx": 131072},
        }
    )
    crowded = plan_from_config(full)
    assert crowded.gpu.fits and crowded.embeddings is None
    profiles = profiles_from_plans(full, crowded)
    assert set(profiles.by_role()) == {"gpu", "cpu", "cpu-embed"}
    assert any("embeddings on the CPU only" in note for note in profiles.notes)


def test_an_expert_split_reaches_the_gpu_workers_command_line(planned: tuple[config.Config, PlanSet]) -> None:
    """A MoE plan's expert split (budget.placement) must reach llama-server, or the GPU worker loads every
    expert on the GPU and runs out of memory; a dense plan passes no such flag."""
    cfg, plans = planned
    moe = dataclasses.replace(plans.gpu, n_cpu_moe=5, cpu_expert_tensors=("ffn_down_exps",))
    gpu = profiles_from_plans(cfg, dataclasses.replace(plans, gpu=moe)).gpu
    assert gpu is not None and (gpu.n_cpu_moe, gpu.cpu_expert_tensors) == (5, ("ffn_down_exps",))
    argv = llama_server_argv(Path("/opt/llama-server"), gpu, port=1)
    assert argv[argv.index("--n-cpu-moe") + 1] == "5"
    assert argv[argv.index("--override-tensor") + 1] == r"blk\.5\.ffn_down_exps=CPU"
    dense = profiles_from_plans(cfg, plans).gpu
    assert dense is not None and "--n-cpu-moe" not in llama_server_argv(
        Path("/opt/llama-server"), dense, port=1
    )
