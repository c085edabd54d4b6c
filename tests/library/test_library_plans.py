"""The library's models planned beside the main model, and the worker profiles they start with."""

from __future__ import annotations

from pathlib import Path

from tray_app import config
from tray_app.budget.library_plan import library_share, plan_library_model
from tray_app.budget.plan_set import plan_from_config
from tray_app.library.catalog import catalog_from_config
from tray_app.supervisor.profile import library_profiles

GiB = 1024**3


def library_config(main: Path, gemma: Path, **gemma_entry: object) -> config.Config:
    entry = {"name": "gemma", "path": str(gemma), "n_ctx": 4096, **gemma_entry}
    return config.from_dict({"model": {"path": str(main)}, "models": [entry]})


def test_a_library_model_is_planned_whole_in_what_the_main_model_leaves(
    model_path: Path, gemma_model_path: Path
) -> None:
    cfg = library_config(model_path, gemma_model_path)
    plans = plan_from_config(cfg, vram_override=4 * GiB)
    share = library_share(plans)
    assert share is not None
    left = plans.embeddings.free_bytes if plans.embeddings else plans.gpu.free_bytes
    assert share.free_bytes == left  # the reserve stays the main plan's
    gemma = plan_library_model(cfg, catalog_from_config(cfg).others()[0], plans)
    assert gemma.gpu is not None and gemma.gpu.n_gpu_layers == gemma.gpu.n_layers
    assert gemma.gpu.n_ctx == 4096 and 0 < gemma.vram_bytes <= share.free_bytes
    assert gemma.vram_bytes == gemma.gpu.weights_bytes + gemma.gpu.kv_bytes + gemma.gpu.compute_bytes
    assert gemma.cpu is not None and gemma.cpu.n_ctx == 4096


def test_a_model_that_does_not_fit_whole_runs_on_the_cpu_only_and_says_why(
    model_path: Path, gemma_model_path: Path
) -> None:
    cfg = library_config(model_path, gemma_model_path)
    small = plan_from_config(cfg, vram_override=GiB // 2)  # the main model fits; Gemma's 235 MiB do not
    gemma = plan_library_model(cfg, catalog_from_config(cfg).others()[0], small)
    assert gemma.gpu is None and "does not fit whole" in gemma.gpu_note and gemma.vram_bytes == 0
    cpu_only = library_config(model_path, gemma_model_path, devices=["cpu"])
    plans = plan_library_model(cpu_only, catalog_from_config(cpu_only).others()[0], small)
    assert plans.gpu is None and plans.gpu_note == "its devices do not include the GPU"


def test_its_workers_start_on_demand_unless_preloaded(model_path: Path, gemma_model_path: Path) -> None:
    for preload in (False, True):
        cfg = library_config(model_path, gemma_model_path, preload=preload)
        plans = plan_from_config(cfg, vram_override=4 * GiB)
        entry = catalog_from_config(cfg).others()[0]
        gpu, cpu = library_profiles(cfg, entry, plan_library_model(cfg, entry, plans), plans)
        assert (gpu.role, cpu.role) == ("gpu@gemma", "cpu@gemma")
        assert gpu.model_name == cpu.model_name == entry.name == "gemma"  # its --alias: the library's name
        assert gpu.n_gpu_layers > 0 and cpu.n_gpu_layers == 0
        assert gpu.warm is preload and cpu.warm is False  # preloaded on the GPU when it has a GPU plan
