"""Layers on another machine's device (budget.remote): what the local GPU cannot hold goes to the RPC boxes
before the CPU, each up to what it may use, in llama.cpp's device order; the command line follows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tray_app.budget.footprint import kv_cache_bytes
from tray_app.budget.model_info import ModelInfo
from tray_app.budget.plan import PlanRequest
from tray_app.budget.planner import plan_gpu
from tray_app.budget.remote import RemoteDevice, answering, remote_shares
from tray_app.engine.argv import llama_server_argv
from tray_app.engine.profile import WorkerProfile

from .conftest import GIB, MIB, gpu

REQUEST = PlanRequest(n_ctx=8192, n_parallel=1, reserve_percent=0.0, reserve_min_bytes=0)


def box(name: str, free: int, *, cap: int = 0, problem: str = "") -> RemoteDevice:
    return RemoteDevice(name, f"10.0.0.{len(name)}:50052", "", 24 * GIB, free, cap_bytes=cap, problem=problem)


def test_a_real_gpu_keeps_its_last_layers_and_the_box_takes_the_blocks_below(model_8b: ModelInfo) -> None:
    local = plan_gpu(gpu(4 * GIB, simulated=False), model_8b, REQUEST)
    assert 0 < local.n_gpu_layers < 33
    (share,) = remote_shares(model_8b, REQUEST, local, [box("nas", 2 * GIB)], local_device_in_build=True)
    # The box's layers end where the local GPU's begin: llama.cpp lists RPC devices first.
    assert share.first_layer + share.n_layers == 33 - local.n_gpu_layers and not share.output
    assert share.weights_bytes == share.n_layers * 200 * MIB
    blocks = range(share.first_layer, share.first_layer + share.n_layers)
    assert share.kv_bytes == kv_cache_bytes(model_8b, local.n_ctx, REQUEST, blocks, 1)
    assert share.used_bytes <= share.usable_bytes
    # One more block would not have fit.
    assert share.used_bytes + 200 * MIB + kv_cache_bytes(model_8b, local.n_ctx, REQUEST, range(1), 1) > (
        share.usable_bytes
    )


def test_on_a_simulated_device_the_box_takes_the_last_layers_and_the_output(model_8b: ModelInfo) -> None:
    local = plan_gpu(gpu(4 * GIB), model_8b, REQUEST)
    (share,) = remote_shares(model_8b, REQUEST, local, [box("nas", 2 * GIB)], local_device_in_build=False)
    assert share.output and share.first_layer + share.n_layers == 33
    assert "and the output layer" in share.placement_words()


def test_boxes_fill_in_priority_order_and_the_worker_lists_them_lowest_layers_first(
    model_8b: ModelInfo,
) -> None:
    local = plan_gpu(gpu(3 * GIB, simulated=False), model_8b, REQUEST)
    first, second = box("first", 24 * GIB, cap=GIB), box("second", 24 * GIB, cap=GIB)
    shares = remote_shares(model_8b, REQUEST, local, [first, second], local_device_in_build=True)
    assert [share.peer for share in shares] == ["second", "first"]  # second holds the lower blocks
    assert [share.device for share in shares] == ["RPC0", "RPC1"]
    assert shares[0].first_layer + shares[0].n_layers == shares[1].first_layer
    assert all(share.usable_bytes == GIB for share in shares)  # rpc_memory: used as given, no reserve


def test_no_box_when_the_local_gpu_holds_everything_or_the_box_does_not_answer(model_8b: ModelInfo) -> None:
    whole = plan_gpu(gpu(24 * GIB), model_8b, REQUEST)
    assert remote_shares(model_8b, REQUEST, whole, [box("nas", 8 * GIB)], local_device_in_build=True) == ()
    split = plan_gpu(gpu(4 * GIB), model_8b, REQUEST)
    gone = box("nas", 0, problem="does not answer")
    assert remote_shares(model_8b, REQUEST, split, [gone], local_device_in_build=True) == ()
    assert answering((gone,)) == [(gone.endpoint, False)]
    tiny = box("nas", 24 * GIB, cap=10 * MIB)  # not even the compute buffer
    assert remote_shares(model_8b, REQUEST, split, [tiny], local_device_in_build=True) == ()


def test_the_command_line_carries_rpc_and_the_split_in_device_order() -> None:
    profile = WorkerProfile(
        role="gpu",
        model_path=Path("m.gguf"),
        n_ctx=4096,
        n_gpu_layers=12,
        n_threads=4,
        rpc=("10.0.0.2:50052",),
        rpc_layers=(9,),
    )
    argv = llama_server_argv(Path("llama-server"), profile, 8080)
    assert argv[argv.index("--n-gpu-layers") + 1] == "21"
    assert argv[argv.index("--rpc") + 1] == "10.0.0.2:50052"
    assert argv[argv.index("--tensor-split") + 1] == "9,12"  # the box first, then the local GPU
    simulated = llama_server_argv(Path("llama-server"), replace(profile, simulated_vram_bytes=GIB), 8080)
    # A CPU build has no local GPU device: only the box's layers are offloaded.
    assert simulated[simulated.index("--n-gpu-layers") + 1] == "9" and "--tensor-split" not in simulated
    plain = llama_server_argv(Path("llama-server"), replace(profile, rpc=(), rpc_layers=()), 8080)
    assert "--rpc" not in plain and plain[plain.index("--n-gpu-layers") + 1] == "12"
