"""From the config to both plans: the call the service makes."""

from __future__ import annotations

from tray_app.budget.device import SimulatedDevice
from tray_app.budget.plan_set import cpu_request, cpu_slots, gpu_request, physical_cores, plan_from_config
from tray_app.config import Config

GIB = 1024**3
MIB = 1024**2


def _config(**budget: object) -> Config:
    cfg = Config()
    cfg.device.simulate_vram = "4GiB"
    for key, value in budget.items():
        setattr(cfg.budget, key, value)
    return cfg


def test_default_config_on_a_simulated_gpu(model_path: object) -> None:
    plans = plan_from_config(_config())
    assert plans.device.simulated and plans.device.total_bytes == 4 * GIB
    assert plans.model.n_layers == 30
    assert (plans.gpu.verdict, plans.gpu.n_gpu_layers, plans.gpu.n_layers) == ("gpu", 31, 31)
    assert plans.gpu.n_ctx == 8192 and plans.gpu.simulated
    assert plans.gpu.reserve_bytes == 4 * GIB // 10  # 10 % of 4 GiB is above the 256 MiB floor
    assert plans.cpu.verdict == "cpu" and plans.cpu.device_kind == "ram" and not plans.cpu.simulated
    assert plans.ram.kind == "ram"
    data = plans.to_dict()
    assert set(data) == {
        "device",
        "target",
        "model",
        "gpu",
        "cpu",
        "ram",
        "embeddings",
        "ram_check",
        "boxes",
        "remote",
    }
    # Nothing of the GPU worker's weights in RAM beyond the CPU worker's, and no expert split: a dense model.
    assert data["ram_check"]["need_bytes"] >= plans.cpu.used_bytes and plans.gpu.n_cpu_moe == 0
    assert data["embeddings"]["n_gpu_layers"] == data["embeddings"]["n_layers"]  # beside the chat plan
    assert data["target"]["label"] == "simulated (no GPU)"
    assert data["gpu"]["verdict"] == "gpu"


def test_config_settings_reach_the_request() -> None:
    cfg = _config(n_ctx=1000, n_parallel=2, cache_type="q8_0", flash_attn=True, reserve_percent=25.0)
    request = gpu_request(cfg)
    assert (request.n_ctx, request.n_parallel, request.cache_type_k, request.cache_type_v) == (
        1000,
        2,
        "q8_0",
        "q8_0",
    )
    assert request.flash_attn and request.reserve_percent == 25.0 and request.reserve_min_bytes == 256 * MIB
    cpu = cpu_request(cfg)
    # The CPU worker's slots: two per physical core, at most 4, unless cpu.n_parallel says otherwise.
    assert (cpu.n_parallel, cpu.reserve_percent, cpu.reserve_min_bytes) == (cpu_slots(cfg), 20.0, GIB)
    assert cpu_slots(cfg) == min(4, 2 * physical_cores())
    cfg.cpu.n_parallel = 3
    assert cpu_request(cfg).n_parallel == 3
    plans = plan_from_config(cfg)
    assert (plans.gpu.n_ctx, plans.gpu.n_ctx_per_seq, plans.gpu.cache_type_v) == (1024, 512, "q8_0")


def test_vram_override_is_a_what_if_without_others() -> None:
    plans = plan_from_config(Config(), vram_override=2 * GIB)
    assert plans.device.total_bytes == 2 * GIB and plans.device.used_by_others_bytes == 0
    assert plans.gpu.simulated and "as asked" in plans.device.reason


def test_live_simulated_device_under_pressure() -> None:
    device = SimulatedDevice(1 * GIB)
    relaxed = plan_from_config(_config(), gpu=device)
    device.take("drill", 760 * MIB)
    pressed = plan_from_config(_config(), gpu=device)
    assert (relaxed.gpu.verdict, relaxed.gpu.n_ctx) == ("gpu", 8192)
    # 1 GiB less the 256 MiB reserve and the drill's 760 MiB leaves 8 MiB: less than the compute buffer alone
    assert pressed.gpu.other_bytes == 760 * MIB
    assert (pressed.gpu.verdict, pressed.gpu.n_gpu_layers) == ("cpu", 0)
    assert "760.00 MiB used by others" in pressed.gpu.reason


def test_physical_cores() -> None:
    assert physical_cores() >= 1
