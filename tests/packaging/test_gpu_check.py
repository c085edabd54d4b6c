"""`packaging/gpu_check.py` without a GPU: the run stops clearly where it needs one, and the parts that can
be checked anywhere are (the source trimming, the model skeleton, the buffer comparison, the failover's
verdict)."""

from __future__ import annotations

import ctypes
import io
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "packaging" / "gpu_check.py"
sys.path.insert(0, str(ROOT / "packaging"))

import gpu_check  # noqa: E402
import gpu_check_carry  # noqa: E402
import gpu_check_model  # noqa: E402
import gpu_check_service  # noqa: E402

MIB = 1024 * 1024


def _has_nvidia_gpu() -> bool:
    if shutil.which("nvidia-smi"):
        return True
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


# ------------------------------------------------------------------------------------------ no GPU
@pytest.mark.skipif(_has_nvidia_gpu(), reason="this machine has an NVIDIA GPU: the check would go on")
def test_run_without_a_gpu_stops_there_with_its_own_status(tmp_path: Path) -> None:
    carry = tmp_path / "carry"
    (carry / "wheels").mkdir(parents=True)
    (carry / "llama-cpp-src.tar.gz").write_bytes(b"x" * 1000)
    (carry / "wheels" / "demo-1.0-py3-none-any.whl").write_bytes(b"y" * 100)
    report_path = tmp_path / "out" / "gpu-check.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "run",
            "--report",
            str(report_path),
            "--carry",
            str(carry),
            "--state",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OUT": ""},
    )
    assert done.returncode == gpu_check.EXIT_NO_GPU == 2, done.stderr
    assert "no NVIDIA GPU here: this check needs one; everything before that point ran:" in done.stderr
    assert "source archive 0.0 MiB, 1 wheels" in done.stderr
    report = json.loads(report_path.read_text())
    assert report["verdict"] == "no_gpu"
    assert list(report["phases"]) == ["host", "gpu"]
    assert report["phases"]["host"]["status"] == "ok"
    assert report["phases"]["host"]["carried"]["wheels"] == {"count": 1, "bytes": 100}
    assert report["phases"]["gpu"]["status"] == "no_gpu"
    for phase in report["phases"].values():
        assert phase["seconds"] <= phase["budget_seconds"]
    assert "python" in report["phases"]["host"] and "torch" in report["phases"]["host"]


@pytest.mark.skipif(_has_nvidia_gpu(), reason="this machine has an NVIDIA GPU: the check would go on")
def test_run_without_a_carried_source_says_what_to_do(tmp_path: Path) -> None:
    report_path = tmp_path / "gpu-check.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--report",
            str(report_path),
            "--carry",
            str(tmp_path / "none"),
            "--state",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "nothing carried (run `pack` first)" in done.stderr
    host = json.loads(report_path.read_text())["phases"]["host"]
    assert "gpu_check.py pack" in host["not_prepared"]


def test_the_service_phases_run_as_their_own_script_in_the_checks_environment() -> None:
    """`run` starts them as `python packaging/gpu_check_service.py` (the project on PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = ROOT / "packaging" / "gpu_check_service.py"
    done = subprocess.run(
        [sys.executable, str(script), "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert all(option in done.stdout for option in ("--report", "--deadline", "--model", "--state"))


# ------------------------------------------------------------------------------------------ pack: source
def _tar(path: Path, names: list[str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name in names:
            data = f"content of {name}".encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


KEPT = [
    "top/pyproject.toml",
    "top/CMakeLists.txt",
    "top/llama_cpp/llama.py",
    "top/vendor/llama.cpp/CMakeLists.txt",
    "top/vendor/llama.cpp/src/llama.cpp",
    "top/vendor/llama.cpp/common/arg.cpp",
    "top/vendor/llama.cpp/ggml/src/ggml-cuda/mmq.cu",
    "top/vendor/llama.cpp/ggml/src/ggml-cuda/template-instances/fattn-mma-f16-instance.cu",
    "top/vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c",
    "top/vendor/llama.cpp/ggml/src/ggml-blas/CMakeLists.txt",
    "top/vendor/llama.cpp/tools/server/server.cpp",
    "top/vendor/llama.cpp/tools/mtmd/mtmd.cpp",
    "top/vendor/llama.cpp/tools/ui/CMakeLists.txt",
    "top/vendor/llama.cpp/scripts/ui-assets.cmake",
    "top/vendor/llama.cpp/vendor/miniaudio/miniaudio.h",
]
DROPPED = [
    "top/.git/modules/vendor/llama.cpp/objects/pack/pack-1.pack",
    "top/docs/index.md",
    "top/examples/notebooks/a.ipynb",
    "top/tests/test_llama.py",
    "top/vendor/llama.cpp/.git",
    "top/vendor/llama.cpp/.github/workflows/build.yml",
    "top/vendor/llama.cpp/docs/ops/CUDA.csv",
    "top/vendor/llama.cpp/models/ggml-vocab-gemma-4.gguf",
    "top/vendor/llama.cpp/models/templates/chatml.jinja",
    "top/vendor/llama.cpp/tests/test-backend-ops.cpp",
    "top/vendor/llama.cpp/benches/dgx-spark/results.json",
    "top/vendor/llama.cpp/convert_hf_to_gguf.py",
    "top/vendor/llama.cpp/gguf-py/gguf/gguf.py",
    "top/vendor/llama.cpp/tools/ui/src/app.ts",
    "top/vendor/llama.cpp/tools/ui/package-lock.json",
    "top/vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp",
    "top/vendor/llama.cpp/ggml/src/ggml-hip/CMakeLists.txt",
    "top/vendor/llama.cpp/ggml/src/ggml-sycl/ggml-sycl.cpp",
    "top/vendor/llama.cpp/ggml/src/ggml-metal/ggml-metal.m",
]


def test_the_source_archive_keeps_what_a_cuda_build_compiles(tmp_path: Path) -> None:
    sdist = tmp_path / "sdist.tar.gz"
    names = KEPT + DROPPED
    random.Random(1).shuffle(names)
    _tar(sdist, names)
    out = tmp_path / "carry" / "src.tar.gz"
    stats = gpu_check_carry.trim_sdist(sdist, out)
    with tarfile.open(out) as tar:
        kept = sorted(tar.getnames())
        assert tar.extractfile("top/vendor/llama.cpp/ggml/src/ggml-cuda/mmq.cu").read() == (  # type: ignore[union-attr]
            b"content of top/vendor/llama.cpp/ggml/src/ggml-cuda/mmq.cu"
        )
    assert kept == sorted(KEPT)
    assert stats["members_kept"] == len(KEPT)
    assert stats["members_dropped"] == len(DROPPED)
    assert stats["archive_bytes"] == out.stat().st_size
    assert "vendor/llama.cpp/docs" in stats["largest_dropped"]
    assert not out.with_name(out.name + ".partial").exists()


def test_the_filter_on_single_names() -> None:
    keep, top = gpu_check_carry.keep_member, "llama_cpp_python-0.3.36"
    assert keep(top)
    assert keep(f"./{top}/vendor/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu")
    assert not keep(f"./{top}/vendor/llama.cpp/ggml/src/ggml-webgpu/x.cpp")
    assert keep(f"{top}/vendor/llama.cpp/ggml/src/ggml-rpc/ggml-rpc.cpp")


def test_requirements_leave_out_the_gui_the_engine_and_what_the_machine_has() -> None:
    names = {gpu_check_carry.requirement_name(req) for req in gpu_check_carry.check_requirements()}
    assert {"starlette", "uvicorn", "gguf", "diskcache", "scikit-build-core", "tomli-w"} <= names
    assert not names & {"pyside6-essentials", "llama-cpp-python", "numpy", "torch"}


# ------------------------------------------------------------------------------------------ the model
def _halves(data: bytes, stride: int, offset: int) -> set[float]:
    return {struct.unpack_from("<e", data, start + offset)[0] for start in range(0, len(data), stride)}


def test_generated_weights_are_small_and_finite() -> None:
    rng = random.Random(3)
    q41 = gpu_check_model.generated_tensor("Q4_1", 20 * 64, rng)
    assert _halves(q41, 20, 0) == {struct.unpack("<e", struct.pack("<e", 0.004))[0]}
    assert _halves(q41, 20, 2) == {struct.unpack("<e", struct.pack("<e", -0.032))[0]}
    q80 = gpu_check_model.generated_tensor("Q8_0", 34 * 16, rng)
    assert len(_halves(q80, 34, 0)) == 1
    f16 = gpu_check_model.generated_tensor("F16", 2 * 4096, rng)
    values = struct.unpack(f"<{4096}e", f16)
    assert all(math.isfinite(value) and 2**-8 < abs(value) < 2**-4 for value in values)
    assert any(value < 0 for value in values) and any(value > 0 for value in values)
    with pytest.raises(ValueError):
        gpu_check_model.generated_tensor("Q6_K", 210, rng)


def test_the_model_skeleton_rebuilds_the_bundled_models_layout(tmp_path: Path, model_path: Path) -> None:
    from gguf import GGUFReader

    from tray_app.budget.model_info import inspect_model

    skeleton, manifest = tmp_path / "model.gguf.gz", tmp_path / "model.json"
    packed = gpu_check_model.pack_model(model_path, skeleton, manifest)
    assert packed["skeleton_bytes"] < 4 * MIB  # the 94 MiB file travels as this
    rebuilt = tmp_path / "rebuilt.gguf"
    result = gpu_check_model.rebuild_model(skeleton, manifest, rebuilt)
    assert result["bytes"] == model_path.stat().st_size
    original, copy = GGUFReader(str(model_path)), GGUFReader(str(rebuilt))
    assert [(t.name, t.tensor_type, t.data_offset, t.n_bytes) for t in original.tensors] == [
        (t.name, t.tensor_type, t.data_offset, t.n_bytes) for t in copy.tensors
    ]
    first = original.tensors[0].data_offset
    assert model_path.read_bytes()[:first] == rebuilt.read_bytes()[:first]  # header, tokenizer, template
    for before, after in zip(original.tensors, copy.tensors, strict=True):
        same = bytes(before.data.tobytes()) == bytes(after.data.tobytes())
        assert same == (before.tensor_type.name == "F32"), before.name  # norms kept, matrices generated
    ours, theirs = inspect_model(model_path, use_cache=False), inspect_model(rebuilt, use_cache=False)
    assert (ours.n_layers, ours.n_embd, ours.n_ctx_train) == (
        theirs.n_layers,
        theirs.n_embd,
        theirs.n_ctx_train,
    )


# ------------------------------------------------------------------------------------------ buffers
LOG = """\
llama_model_loader: loaded meta data with 33 key-value pairs and 272 tensors from old.gguf
load_tensors:        CUDA0 model buffer size =    10.00 MiB
llama_model_loader: loaded meta data with 33 key-value pairs and 272 tensors from model.gguf
load_tensors: offloading 30 repeating layers to GPU
load_tensors: offloaded 31/31 layers to GPU
load_tensors:        CUDA0 model buffer size =    92.10 MiB
load_tensors:   CPU_Mapped model buffer size =    28.69 MiB
llama_context:  CUDA_Host  output buffer size =     0.75 MiB
llama_kv_cache:      CUDA0 KV buffer size =   180.00 MiB
llama_context:      CUDA0 compute buffer size =    90.00 MiB
llama_context:  CUDA_Host compute buffer size =    10.00 MiB
llama_context:      CUDA0 compute buffer size =   100.00 MiB
"""


def test_printed_buffers_per_backend_from_the_last_load() -> None:
    printed = gpu_check_service.per_backend(gpu_check_service.last_load(LOG))
    assert printed["CUDA0"] == {
        "model": round(92.10 * MIB),
        "kv": 180 * MIB,
        "compute": 100 * MIB,
        "output": 0,
    }
    assert printed["CUDA_Host"] == {"model": 0, "kv": 0, "compute": 10 * MIB, "output": round(0.75 * MIB)}
    assert printed["CPU_Mapped"]["model"] == round(28.69 * MIB)


def test_predicted_printed_and_measured_side_by_side() -> None:
    printed = gpu_check_service.per_backend(gpu_check_service.last_load(LOG))
    plan = {
        "weights_bytes": round(92.10 * MIB) + 1000,  # within the rounding of the printed MiB
        "host_weights_bytes": round(28.69 * MIB),
        "kv_bytes": 180 * MIB,
        "compute_bytes": 80 * MIB,  # 20 % under: outside the compute tolerance
        "output_bytes": round(0.75 * MIB),
    }
    measured = 900 * MIB
    result = gpu_check_service.compare_buffers(plan, printed, measured)
    rows = result["buffers"]
    assert rows["weights"]["within"] and rows["weights"]["difference_bytes"] == 1000
    assert rows["kv"] == {
        "predicted_bytes": 180 * MIB,
        "printed_bytes": 180 * MIB,
        "difference_bytes": 0,
        "ratio": 1.0,
        "tolerance": 0.01,
        "within": True,
    }
    assert rows["host_weights"]["within"] and rows["output"]["within"]
    assert rows["compute"]["ratio"] == 0.8 and not rows["compute"]["within"]
    assert result["outside_tolerance"] == ["compute"]
    total = result["device_total"]
    printed_device = round(92.10 * MIB) + 180 * MIB + 100 * MIB
    assert total["printed_device_bytes"] == printed_device
    assert total["predicted_device_bytes"] == plan["weights_bytes"] + plan["kv_bytes"] + plan["compute_bytes"]
    assert total["unaccounted_bytes"] == measured - printed_device  # CUDA context, cuBLAS, the pool
    assert total["printed_host_compute_bytes"] == 10 * MIB


def test_without_an_nvml_reading_the_total_says_so() -> None:
    result = gpu_check_service.compare_buffers({}, {}, None)
    assert result["device_total"]["measured_process_bytes"] is None
    assert "unaccounted_bytes" not in result["device_total"]


# ------------------------------------------------------------------------------------------ failover
def _job(worker: str, attempts: list[tuple[str, str]], **extra: object) -> dict[str, object]:
    log = [
        {
            "number": n,
            "worker": w,
            "outcome": o,
            "error": "oom_decode: CUDA error: out of memory" if o == "failed" else None,
        }
        for n, (w, o) in enumerate(attempts, start=1)
    ]
    return {"id": f"job-{worker}-{len(attempts)}", "state": "completed", "worker": worker,
            "attempts": len(attempts), "attempt_log": log, "answers_to_client": 1, "prompt_words": 400,
            **extra}  # fmt: skip


OOM_LOG = "ggml_cuda_pool: CUDA error: out of memory\n  current device: 0\n"


def test_a_failover_that_happened_exactly_once_passes() -> None:
    jobs = [_job("gpu", [("gpu", "completed")]), _job("cpu", [("gpu", "failed"), ("cpu", "completed")])]
    verdict = gpu_check_service.judge_failover(jobs, OOM_LOG)
    assert verdict["passed"] and verdict["exercised"] and verdict["job_index"] == 1
    assert verdict["allocation_failure_lines"] == ["ggml_cuda_pool: CUDA error: out of memory"]


def test_a_failover_judged_on_each_count() -> None:
    twice = _job("cpu", [("gpu", "failed"), ("cpu", "completed"), ("cpu", "completed")], answers_to_client=2)
    verdict = gpu_check_service.judge_failover([twice], "")
    assert not verdict["passed"]
    assert any("3 attempts recorded" in problem for problem in verdict["problems"])
    assert any("2 completed attempts" in problem for problem in verdict["problems"])
    assert any("received 2 answers" in problem for problem in verdict["problems"])
    assert any("no failed CUDA allocation" in problem for problem in verdict["problems"])
    lost = _job("gpu", [("gpu", "failed")], state="failed")
    problems = gpu_check_service.judge_failover([lost], OOM_LOG)["problems"]
    assert any("ended failed" in problem for problem in problems)


def test_no_failure_under_pressure_is_reported_as_not_exercised() -> None:
    jobs = [_job("gpu", [("gpu", "completed")]), _job("gpu", [("gpu", "completed")])]
    verdict = gpu_check_service.judge_failover(jobs, "")
    assert not verdict["exercised"] and not verdict["passed"]
    assert "needed no new device memory" in verdict["problems"][0]


def test_prompt_sizes_grow_and_stay_inside_a_gpu_slot() -> None:
    assert gpu_check_service.job_sizes(2048) == [48, 160, 400, 1000, 1228]
    assert gpu_check_service.job_sizes(512) == [48, 160, 307]
    assert max(gpu_check_service.job_sizes(100)) == 64
