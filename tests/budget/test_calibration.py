"""Measured buffer sizes are kept per model and settings and used by the next plan."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from tray_app import paths
from tray_app.budget import calibration
from tray_app.budget.plan import ComputeSettings
from tray_app.budget.plan_set import plan_from_config
from tray_app.config import Config
from tray_app.engine.llama_log import BufferSizes

MIB = 1024**2
SETTINGS = ComputeSettings(
    n_ctx=2048, n_parallel=1, cache_type_k="f16", cache_type_v="f16", flash_attn=False, n_ubatch=512
)
MEASURED = BufferSizes(
    model_bytes=92 * MIB,
    kv_bytes=45 * MIB,
    compute_bytes=99 * MIB,
    output_bytes=MIB,
    model_buffers=(("CPU_Mapped", 92 * MIB),),
)


def test_record_then_lookup(model_path: Path) -> None:
    written = calibration.record_measurement(model_path, SETTINGS, MEASURED)
    assert written.is_relative_to(paths.data_dir())
    record = json.loads(written.read_text())
    assert record["model"] == model_path.name and record["settings"]["n_ctx"] == 2048
    assert calibration.lookup_measurement(model_path, SETTINGS) == MEASURED
    # the context is keyed as llama.cpp pads it: asking for 2000 finds the 2048 measurement
    padded = ComputeSettings(2000, 1, "f16", "f16", False, 512)
    assert calibration.lookup_measurement(model_path, padded) == MEASURED
    # other settings were never measured
    assert (
        calibration.lookup_measurement(model_path, ComputeSettings(4096, 1, "f16", "f16", False, 512)) is None
    )
    assert (
        calibration.lookup_measurement(model_path, ComputeSettings(2048, 1, "f16", "f16", True, 512)) is None
    )


def test_measurements_are_per_model_file(tmp_path: Path, model_path: Path) -> None:
    calibration.record_measurement(model_path, SETTINGS, MEASURED)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + b"\0" * 100)
    assert calibration.lookup_measurement(other, SETTINGS) is None
    assert calibration.lookup_measurement(tmp_path / "missing.gguf", SETTINGS) is None


def test_a_damaged_measurement_is_ignored(model_path: Path) -> None:
    written = calibration.record_measurement(model_path, SETTINGS, MEASURED)
    written.write_text("{")
    assert calibration.lookup_measurement(model_path, SETTINGS) is None
    written.write_text(json.dumps({"format": 1, "settings": {}, "buffers": {}}))
    assert calibration.lookup_measurement(model_path, SETTINGS) is None


def test_estimate_first_then_measured(tmp_path: Path, model_path: Path) -> None:
    model = tmp_path / model_path.name
    shutil.copyfile(model_path, model)
    cfg = Config()
    cfg.model.path = str(model)
    cfg.device.simulate_vram = "4GiB"
    cfg.budget.n_ctx = 2048
    cfg.cpu.n_ctx = 2048
    cfg.budget.n_parallel = cfg.cpu.n_parallel = 1  # the measurement's settings
    cfg.budget.flash_attn = SETTINGS.flash_attn
    cfg.embeddings.n_ctx, cfg.embeddings.n_parallel = SETTINGS.n_ctx, SETTINGS.n_parallel
    first = plan_from_config(cfg)
    assert first.gpu.compute_source == "estimate"
    calibration.record_measurement(model, SETTINGS, MEASURED)
    second = plan_from_config(cfg)
    assert (second.gpu.compute_source, second.gpu.compute_bytes) == ("measured", 99 * MIB)
    # the CPU worker's plan at the same settings uses it too
    assert (second.cpu.compute_source, second.cpu.compute_bytes) == ("measured", 99 * MIB)
    # the embeddings worker's plan, at the same context and slots, does not: its logits are a batch's
    assert second.embeddings is not None and second.embeddings.compute_source == "estimate"
    assert second.embeddings.compute_bytes > 99 * MIB
    calibration.record_measurement(
        model, replace(SETTINGS, embeddings=True), replace(MEASURED, compute_bytes=103 * MIB)
    )
    third = plan_from_config(cfg)
    assert third.embeddings is not None
    assert (third.embeddings.compute_source, third.embeddings.compute_bytes) == ("measured", 103 * MIB)
    assert third.gpu.compute_bytes == 99 * MIB
