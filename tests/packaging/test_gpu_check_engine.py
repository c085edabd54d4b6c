"""The GPU check's carried engine and its probe, without a GPU: the build's arguments for another machine's
card, the stripped wheel's RECORD, the driver stub's names, where cuBLAS is found, the resumable build's
evidence, and a probe step that names a native crash."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))

import gpu_check_engine  # noqa: E402
import gpu_check_phases  # noqa: E402
import gpu_check_probe  # noqa: E402

from tray_app.config import from_dict  # noqa: E402
from tray_app.engine_build import build as builder  # noqa: E402


# ------------------------------------------------------------------------------------------ the build here
def test_the_cuda_arguments_name_the_architecture_and_a_portable_cpu(tmp_path: Path) -> None:
    args = gpu_check_engine.carried_cmake_args(
        "90", tmp_path / "inc", tmp_path / "lib", tmp_path / "libcuda.so"
    )
    assert "-DCMAKE_CUDA_ARCHITECTURES=90-real" in args  # machine code for sm_90 only: no PTX
    assert "-DGGML_NATIVE=OFF" in args  # not this machine's AVX-512: the GPU machine's CPU may lack it
    assert f"-DCUDA_cuda_driver_LIBRARY={tmp_path / 'libcuda.so'}" in args
    assert not any("native" in arg for arg in args)


def test_the_arguments_are_replaced_for_one_build_only() -> None:
    before = builder.BACKEND_CMAKE_ARGS["cuda"]
    with gpu_check_engine.cuda_arguments(["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90-real"]):
        assert "-DCMAKE_CUDA_ARCHITECTURES=90-real" in builder.cmake_args("cuda")
    assert builder.BACKEND_CMAKE_ARGS["cuda"] == before
    assert "-DCMAKE_CUDA_ARCHITECTURES=native" in builder.cmake_args("cuda")


def test_the_engine_key_follows_source_architecture_and_compiler(tmp_path: Path) -> None:
    sdist = tmp_path / "src.tar.gz"
    sdist.write_bytes(b"source")
    key = gpu_check_engine.engine_key(sdist, "90", "13.0 (V13.0.88)")
    assert key == gpu_check_engine.engine_key(sdist, "90", "13.0 (V13.0.88)")
    assert key != gpu_check_engine.engine_key(sdist, "89", "13.0 (V13.0.88)")
    assert key != gpu_check_engine.engine_key(sdist, "90", "13.1 (V13.1.80)")
    sdist.write_bytes(b"other source")
    assert key != gpu_check_engine.engine_key(sdist, "90", "13.0 (V13.0.88)")


def test_the_driver_stub_exports_the_linked_names(tmp_path: Path) -> None:
    header = tmp_path / "cuda.h"
    header.write_text(
        "typedef int CUresult;\n#define CUDAAPI\n#define cuMemAlloc cuMemAlloc_v2\n"
        "CUresult CUDAAPI cuInit(unsigned int flags);\n"
        "CUresult CUDAAPI cuMemAlloc(void **p, unsigned long n);\n"
        "typedef CUresult (*PFN_cuInit)(unsigned int);\n"
    )
    assert gpu_check_engine.driver_functions(header) == ["cuInit", "cuMemAlloc_v2"]


def test_the_driver_stub_is_found_by_its_soname(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Linking a program against libggml-cuda.so looks for libcuda.so.1: the stub answers to that name."""
    (tmp_path / "cuda.h").write_text("typedef int CUresult;\nCUresult cuMemCreate(void);\n")
    monkeypatch.setattr(gpu_check_engine, "cuda_include", lambda: tmp_path)
    stub = gpu_check_engine.make_driver_stub(tmp_path / "stub")
    assert (tmp_path / "stub" / "libcuda.so.1").resolve() == stub.resolve()
    dynamic = subprocess.run(["objdump", "-p", "-T", str(stub)], capture_output=True, text=True).stdout
    assert "SONAME               libcuda.so.1" in dynamic and "cuMemCreate" in dynamic
    assert gpu_check_engine.make_driver_stub(tmp_path / "stub") == stub  # made once


def test_build_steps_from_the_log() -> None:
    log = "[engine] step 1/414\n  [12/414] nvcc ...\n  [413/414] linking\n  [414/414] install\n"
    assert gpu_check_engine.build_steps(log) == "414/414"
    assert gpu_check_engine.build_steps("configuring") is None


def test_a_killed_pack_is_timed_to_its_last_step_and_added_to_the_next(tmp_path: Path) -> None:
    first = gpu_check_engine.attempt_started(tmp_path)
    first[-1]["started"] = time.time() - 100  # began 100 s ago, then was killed 40 s ago...
    (tmp_path / "pack-attempts.json").write_text(json.dumps(first))
    (tmp_path / ".ninja_log").write_text("# ninja log v6\n0\t30000\t0\ta.o\tx\n0\t20000\t0\tb.o\ty\n")
    os.utime(tmp_path / ".ninja_log", (time.time() - 40, time.time() - 40))  # ...after its last step
    attempts = gpu_check_engine.attempt_started(tmp_path)
    attempts[-1]["started"] = time.time() - 10  # the second attempt: 10 s
    assert 69 <= gpu_check_engine.attempt_ended(tmp_path, attempts) <= 71
    assert gpu_check_engine.ninja_step_seconds(tmp_path) == 50.0


# ------------------------------------------------------------------------------------------ the wheel
def _wheel(path: Path, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("llama_cpp/__init__.py", "__version__ = '0.3.36'\n")
        wheel.writestr("llama_cpp/llama_cpp.py", '_lib_base_name = "demo"\n')
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("llama_cpp_python-0.3.36.dist-info/WHEEL", "Wheel-Version: 1.0\n")
        wheel.writestr("llama_cpp_python-0.3.36.dist-info/RECORD", "stale\n")


def _cc(tmp_path: Path, name: str, source: str, *flags: str) -> bytes:
    (tmp_path / f"{name}.c").write_text(source)
    out = tmp_path / name
    subprocess.run(["cc", "-fPIC", "-g", "-o", str(out), str(tmp_path / f"{name}.c"), *flags], check=True)
    return out.read_bytes()


def test_the_carried_wheel_is_stripped_deduplicated_and_its_record_matches(tmp_path: Path) -> None:
    """As built, a wheel holds each library three times (libX.so, libX.so.0, libX.so.0.25.3: no symbolic
    links in a wheel) and the build's own folders in its RUNPATH; carried, one copy each by the names that
    are loaded, and no RUNPATH into the build folder."""
    build = tmp_path / "pack"
    (build / "stub").mkdir(parents=True)
    library = _cc(
        tmp_path,
        "libdemo.so.0.1.0",
        '#include <stdio.h>\nint demo_one(int x) { return printf("%d", x); }\n',
        "-shared",
        "-Wl,-soname,libdemo.so.0",
        f"-Wl,-rpath,$ORIGIN:{build / 'stub'}",
        "-Wl,--enable-new-dtags",
    )
    (tmp_path / "libdemo.so.0").write_bytes(library)
    program = _cc(
        tmp_path, "demo-server", "int demo_one(int);\nint main(void) { return demo_one(1); }\n",
        f"-L{tmp_path}", "-l:libdemo.so.0",
    )  # fmt: skip
    lib = "llama_cpp/lib/"
    wheel, carried = tmp_path / "in.whl", tmp_path / "carry" / "engine" / "in.whl"
    _wheel(
        wheel,
        {f"{lib}libdemo.so": library, f"{lib}libdemo.so.0": library, f"{lib}libdemo.so.0.1.0": library,
         "llama_cpp/bin/demo-server": program},
    )  # fmt: skip
    result = gpu_check_engine.strip_wheel(wheel, carried, build)
    assert result["left_out"] == [f"{lib}libdemo.so.0.1.0"]  # libdemo.so: Python's; .so.0: the soname
    assert result["unpacked_bytes"] < result["unpacked_bytes_as_built"]
    assert result["bytes"] == carried.stat().st_size
    assert result["needs_at_least"]["GLIBC"]  # printf's version: the GPU machine's C library must have it
    with zipfile.ZipFile(carried) as archive:
        rows = list(
            csv.reader(io.StringIO(archive.read("llama_cpp_python-0.3.36.dist-info/RECORD").decode()))
        )
        assert sorted(row[0] for row in rows) == sorted(archive.namelist())
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                assert (digest, size) == ("", "")
                continue
            data = archive.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={expected}", len(data))
        kept = tmp_path / "kept.so"
        kept.write_bytes(archive.read(f"{lib}libdemo.so.0"))
    assert gpu_check_engine.dynamic_entries(kept)["RUNPATH"] == ["$ORIGIN"]
    assert not list(carried.parent.glob("*.partial")) and not list(carried.parent.glob("*.strip"))


def test_the_names_python_loads() -> None:
    sources = {
        "llama_cpp/llama_cpp.py": b'_lib_base_name = "llama"\n_lib = load_shared_library(_lib_base_name, p)',
        "llama_cpp/_ggml.py": b'libggml = ctypes_ext.load_shared_library("ggml", libggml_base_path)',
    }
    assert gpu_check_engine.loaded_by_name(sources) == {"libllama.so", "libggml.so"}


def test_only_copies_nothing_loads_are_left_out() -> None:
    elf = b"\x7fELF" + b"cuda"
    other = b"\x7fELF" + b"common"
    files = {
        "llama_cpp/lib/libggml-cuda.so": elf,
        "llama_cpp/lib/libggml-cuda.so.0": elf,
        "llama_cpp/lib/libggml-cuda.so.0.25.3": elf,
        "llama_cpp/lib/libcommon.so": other,  # nothing names it: every copy stays rather than none
        "llama_cpp/lib/libcommon.so.0.5.0": other,
        "llama_cpp/bin/llama-server": b"\x7fELFserver",
    }
    drop = gpu_check_engine.copies_to_drop(files, {"libggml-cuda.so.0"}, {"libllama.so"})
    assert drop == {"llama_cpp/lib/libggml-cuda.so", "llama_cpp/lib/libggml-cuda.so.0.25.3"}


def test_a_runpath_into_the_build_folder_is_cut_in_place(tmp_path: Path) -> None:
    runpath = f"$ORIGIN:{tmp_path / 'cublas/lib'}:{tmp_path / 'stub'}"
    data = b"head\0" + runpath.encode() + b"\0tail"
    cut = gpu_check_engine.without_runpath_under(data, runpath, tmp_path)
    assert len(cut) == len(data) and cut.startswith(b"head\0$ORIGIN\0") and cut.endswith(b"\0tail")
    assert gpu_check_engine.without_runpath_under(data, runpath, tmp_path / "elsewhere") == data


def test_a_carried_engine_is_one_with_its_wheel(tmp_path: Path) -> None:
    folder = tmp_path / "engine"
    folder.mkdir()
    (folder / "engine.json").write_text(json.dumps({"arch": "90", "wheel": "x.whl"}))
    assert gpu_check_engine.carried_manifest(tmp_path) is None  # the wheel did not travel
    (folder / "x.whl").write_bytes(b"PK")
    assert gpu_check_engine.carried_manifest(tmp_path) == {"arch": "90", "wheel": "x.whl"}


# ------------------------------------------------------------------------------------------ there
def test_architectures_as_cmake_names_them() -> None:
    assert gpu_check_engine.local_arch("9.0") == "90"
    assert gpu_check_engine.local_arch("8.6,8.9") == "86,89"
    assert gpu_check_engine.local_arch("") == ""


def test_cuda_libraries_are_found_in_pytorchs_nvidia_wheels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_check_engine, "CUDA_HOME", tmp_path / "no-toolkit")
    site = tmp_path / "site-packages"
    cu13, old = site / "nvidia" / "cu13" / "lib", site / "nvidia" / "cuda_runtime" / "lib"
    cu13.mkdir(parents=True)
    old.mkdir(parents=True)
    names = ["libcublasLt.so.13", "libcudart.so.13"]
    assert gpu_check_engine.folders_for(names, [str(site)]) == []
    (cu13 / "libcublasLt.so.13").write_bytes(b"")
    (old / "libcudart.so.13").write_bytes(b"")
    assert gpu_check_engine.folders_for(names, [str(site)]) == [cu13.resolve(), old.resolve()]


def test_an_interrupted_build_is_seen_by_its_ninja_log(tmp_path: Path) -> None:
    assert gpu_check_phases.ninja_steps_done(tmp_path) == 0
    (tmp_path / ".ninja_log").write_text("# ninja log v6\n1\t2\t0\ta.o\tx\n3\t4\t0\tb.o\ty\n")
    assert gpu_check_phases.ninja_steps_done(tmp_path) == 2


def test_the_machine_is_known_again_on_the_same_boot(tmp_path: Path) -> None:
    first = gpu_check_phases.machine_identity(tmp_path)
    assert first["earlier_run_here"] is False and first["boot_id"]
    again = gpu_check_phases.machine_identity(tmp_path)
    assert again["earlier_run_here"] is True and again["same_boot_as_earlier_run"] is True


# ------------------------------------------------------------------------------------------ the probe
def test_a_probe_step_names_a_native_crash(tmp_path: Path) -> None:
    crash = "import ctypes; print('before', flush=True); ctypes.string_at(0)"
    result = gpu_check_probe.run_step(
        [sys.executable, "-c", crash], tmp_path / "probe-crash.log", 60, gpu_check_probe.step_env()
    )
    assert result["exit"] == -11 and result["signal"] == "SIGSEGV"
    assert "before" in result["output_tail"]
    assert "Fatal Python error: Segmentation fault" in result["output_tail"]  # PYTHONFAULTHANDLER=1
    assert gpu_check_probe.crashed(result)


def test_a_probe_step_that_hangs_is_stopped(tmp_path: Path) -> None:
    result = gpu_check_probe.run_step(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        tmp_path / "probe-hang.log",
        0.5,
        gpu_check_probe.step_env(),
    )
    assert result["timed_out"] is True and result["signal"] in ("SIGTERM", "SIGKILL")
    assert not gpu_check_probe.crashed(result)


def test_the_probes_service_config_is_a_valid_failsoft_config(tmp_path: Path) -> None:
    text = gpu_check_probe.serve_config(tmp_path / 'a "model".gguf')
    config = from_dict(tomllib.loads(text), source="probe config")
    assert config.model.path == str(tmp_path / 'a "model".gguf')
    assert config.cpu.enabled and config.server.host == "127.0.0.1"


def test_ready_means_every_present_worker_ready() -> None:
    assert gpu_check_probe.all_ready({"gpu": "ready", "cpu": "ready"})
    assert gpu_check_probe.all_ready({"gpu": "ready", "cpu": "absent"})
    assert not gpu_check_probe.all_ready({"gpu": "loading", "cpu": "ready"})
    assert not gpu_check_probe.all_ready({"gpu": None, "cpu": None})


# ------------------------------------------------------------------------------------------ which engine
def _carry(tmp_path: Path, arch: str, source: bool) -> Path:
    carry = tmp_path / "carry"
    (carry / "engine").mkdir(parents=True)
    (carry / "engine" / "e.whl").write_bytes(b"PK")
    (carry / "engine" / "engine.json").write_text(json.dumps({"arch": arch, "key": "k", "wheel": "e.whl"}))
    if source:
        (carry / "llama-cpp-src.tar.gz").write_bytes(b"x")
    return carry


def _engine_phase(tmp_path: Path, carry: Path) -> tuple[dict[str, object], str]:
    report = gpu_check_phases.Report(tmp_path / "gpu-check.json", time.time() + 60)
    status = "ok"
    try:
        gpu_check_phases.phase_engine(report, carry, tmp_path / "venv", tmp_path / "state", tmp_path)
    except gpu_check_phases.PhaseStop as stop:
        status = stop.status
    return report.phases["engine"], status


def test_the_carried_engine_is_used_for_its_own_architecture_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def check(*args: object) -> str:
        calls.append("check")
        return ""

    monkeypatch.setattr(gpu_check_phases, "install_carried", lambda *args: calls.append("install"))
    monkeypatch.setattr(gpu_check_phases, "check_server", check)
    monkeypatch.setattr(gpu_check_phases, "build_on_device", lambda *args: calls.append("build"))
    monkeypatch.setattr(gpu_check_phases.build_engine, "cuda_architectures", lambda: "9.0")
    entry, status = _engine_phase(tmp_path, _carry(tmp_path, "90", source=True))
    assert (status, calls) == ("ok", ["install", "check"])  # no compiler run
    calls.clear()
    monkeypatch.setattr(gpu_check_phases.build_engine, "cuda_architectures", lambda: "8.6")
    entry, status = _engine_phase(tmp_path, _carry(tmp_path / "b", "90", source=True))
    assert (status, calls) == ("ok", ["build", "check"])
    assert entry["carried_skipped"] == "the carried engine is for sm_90, this card is sm_86"


def test_a_carried_engine_that_does_not_run_falls_back_to_the_build_when_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_check_phases, "install_carried", lambda *args: None)
    monkeypatch.setattr(gpu_check_phases, "check_server", lambda *args: "libraries not found: libcuda.so.1")
    monkeypatch.setattr(gpu_check_phases.build_engine, "cuda_architectures", lambda: "9.0")
    entry, status = _engine_phase(tmp_path, _carry(tmp_path, "90", source=False))
    assert status == "failed" and entry["carried_failed"] == "libraries not found: libcuda.so.1"
    assert "no carried source to build from" in str(entry["message"])
