"""Which workers' buffers are kept for the planner, and under which settings (real files in the test's
data dir; the buffers are what a load printed)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tray_app.budget import calibration
from tray_app.engine.llama_log import BufferSizes
from tray_app.engine.profile import WorkerProfile
from tray_app.supervisor import calibration as supervisor_calibration

MIB = 1024**2
BUFFERS = BufferSizes(model_bytes=92 * MIB, kv_bytes=45 * MIB, compute_bytes=16 * MIB, output_bytes=MIB)


def test_an_embeddings_worker_is_kept_apart_from_the_chat_worker(gpu_profile: WorkerProfile) -> None:
    embed = replace(gpu_profile, role="gpu-embed", pooling="mean")
    supervisor_calibration.record_calibration(
        embed, replace(BUFFERS, compute_bytes=103 * MIB), gpu_build=True
    )
    supervisor_calibration.record_calibration(gpu_profile, BUFFERS, gpu_build=True)
    model = gpu_profile.model_path
    assert calibration.lookup_measurement(model, supervisor_calibration.compute_settings(embed)) == replace(
        BUFFERS, compute_bytes=103 * MIB
    )
    assert (
        calibration.lookup_measurement(model, supervisor_calibration.compute_settings(gpu_profile)) == BUFFERS
    )


@pytest.mark.parametrize("gpu_build", [False, True])
def test_a_cpu_worker_is_kept_only_without_a_gpu_backend(cpu_profile: WorkerProfile, gpu_build: bool) -> None:
    """With a GPU build a CPU worker's compute buffer is not what a VRAM plan at its settings needs."""
    embed = replace(cpu_profile, role="cpu-embed", pooling="mean")
    for profile in (cpu_profile, embed):
        supervisor_calibration.record_calibration(profile, BUFFERS, gpu_build=gpu_build)
    kept = [
        calibration.lookup_measurement(profile.model_path, supervisor_calibration.compute_settings(profile))
        for profile in (cpu_profile, embed)
    ]
    assert kept == ([None, None] if gpu_build else [BUFFERS, BUFFERS])
