"""The GPU check's phases on the machine's own Python, before the project is importable: host, gpu,
python_env, engine and model. Each fills its entry in the report; one that cannot go on raises `PhaseStop`.
Standard library only."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import build_engine  # the packaging folder's own module
from check_report import PhaseStop, Report, tail
from gpu_check_carry import ARCHIVE_NAME, MANIFEST_NAME, SKELETON_NAME, WHEELS_NAME, check_requirements
from gpu_check_model import rebuild_model

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"


def run_text(command: list[str], timeout: float = 30, **kwargs: Any) -> tuple[int, str]:
    """A command's exit status and output (stdout and stderr); 127 when it cannot start, 124 on timeout."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, errors="replace", **kwargs
        )
    except FileNotFoundError as error:
        return 127, str(error)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f}s"
    return done.returncode, (done.stdout + done.stderr).strip()


def tool_versions() -> dict[str, Any]:
    """The build tools and GPU tools on PATH (and CUDA's default folder), with their versions."""
    cuda_bin = Path("/usr/local/cuda/bin")
    if shutil.which("nvcc") is None and (cuda_bin / "nvcc").exists():
        os.environ["PATH"] = f"{cuda_bin}{os.pathsep}{os.environ.get('PATH', '')}"
    tools: dict[str, Any] = {}
    for tool, flag in (("cmake", "--version"), ("ninja", "--version"), ("c++", "--version")):
        path = shutil.which(tool)
        tools[tool] = {"path": path, "version": run_text([tool, flag])[1].splitlines()[0] if path else None}
    nvcc = shutil.which("nvcc")
    version = run_text(["nvcc", "--version"])[1] if nvcc else ""
    release = re.search(r"release ([\d.]+)", version)
    tools["nvcc"] = {"path": nvcc, "version": release.group(1) if release else None}
    if nvcc:
        # ggml-cuda links cuBLAS: a toolkit with nvcc alone (no cuBLAS headers) configures, then fails.
        toolkit = Path(nvcc).resolve().parent.parent
        headers = [toolkit / "include", toolkit / "targets" / "x86_64-linux" / "include"]
        found = next((str(h / "cublas_v2.h") for h in headers if (h / "cublas_v2.h").exists()), None)
        tools["cublas"] = {"path": found}
    tools["nvidia-smi"] = {"path": shutil.which("nvidia-smi")}
    return tools


TORCH_PROBE = """
import json
try:
    import torch
except Exception as error:
    print(json.dumps({"installed": False, "error": f"{type(error).__name__}: {error}"}))
else:
    print(json.dumps({"installed": True, "version": torch.__version__, "cuda": torch.version.cuda,
                      "cuda_available": bool(torch.cuda.is_available())}))
"""


def torch_probe(python: str) -> dict[str, Any]:
    code, output = run_text([python, "-c", TORCH_PROBE], timeout=120)
    try:
        result: dict[str, Any] = json.loads(output.splitlines()[-1])
    except (ValueError, IndexError):
        result = {"installed": False, "error": f"exit {code}: {tail(output, 5)}"}
    if not result.get("installed"):
        result["consequence"] = "the pressure phase cannot run without torch (the `drill` extra)"
    return result


def carried_files(carry: Path) -> dict[str, Any]:
    archive = carry / ARCHIVE_NAME
    wheels = sorted((carry / WHEELS_NAME).glob("*.whl"))
    skeleton, manifest = carry / SKELETON_NAME, carry / MANIFEST_NAME
    found: dict[str, Any] = {
        "folder": str(carry),
        "archive": {"path": str(archive), "bytes": archive.stat().st_size} if archive.exists() else None,
        "wheels": {"count": len(wheels), "bytes": sum(w.stat().st_size for w in wheels)},
        "model_skeleton": {"bytes": skeleton.stat().st_size} if skeleton.exists() else None,
        "model_manifest": manifest.exists(),
    }
    found["bytes"] = (
        sum(path.stat().st_size for path in carry.rglob("*") if path.is_file()) if carry.exists() else 0
    )
    return found


def phase_host(report: Report, carry: Path) -> dict[str, Any]:
    with report.phase("host", 150) as entry:
        entry["python"] = {"version": platform.python_version(), "executable": sys.executable}
        entry["machine"] = {
            "arch": platform.machine(),
            "cores": os.cpu_count(),
            "system": platform.platform(),
        }
        entry["tools"] = tool_versions()
        entry["carried"] = carried_files(carry)
        entry["torch"] = torch_probe(sys.executable)
        missing = [
            name
            for name in ("cmake", "c++", "nvcc", "cublas")
            if not (entry["tools"].get(name) or {}).get("path")
        ]
        if missing:
            entry["missing_tools"] = missing
        if entry["carried"]["archive"] is None:
            entry["not_prepared"] = (
                f"no trimmed llama.cpp source at {carry / ARCHIVE_NAME}: run `python3 packaging/gpu_check.py "
                "pack` on a machine with the network first (`make gpu-check-pack`)"
            )
        return entry


def nvml_count() -> tuple[int | None, str]:
    """NVML's device count through the driver's own library (ctypes), or None and why."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as error:
        return None, f"NVML library not found ({error})"
    if nvml.nvmlInit_v2() != 0:
        return None, "nvmlInit failed (no driver loaded?)"
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None, "nvmlDeviceGetCount failed"
        return int(count.value), "NVML"
    finally:
        nvml.nvmlShutdown()


def phase_gpu(report: Report) -> dict[str, Any]:
    with report.phase("gpu", 30) as entry:
        gpus: list[dict[str, str]] = []
        if shutil.which("nvidia-smi"):
            fields = "index,name,memory.total,memory.free,driver_version,compute_cap"
            code, output = run_text(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
            entry["nvidia_smi"] = {"exit": code, "output": tail(output, 8)}
            if code == 0:
                for line in output.splitlines():
                    values = [value.strip() for value in line.split(",")]
                    if len(values) == 6:
                        gpus.append(dict(zip(fields.split(","), values, strict=True)))
        else:
            entry["nvidia_smi"] = {"exit": None, "output": "nvidia-smi is not installed"}
        count, how = nvml_count()
        entry["nvml"] = {"devices": count, "source": how}
        entry["gpus"] = gpus
        if not gpus and not count:
            raise PhaseStop("no_gpu", f"{entry['nvidia_smi']['output']}; {how}")
        return entry


def layered_venv(venv: Path) -> Path:
    """A venv that sees this interpreter's packages after its own: a `.pth` file names them. (A venv made
    from a venv with --system-site-packages would see the base interpreter's packages, not torch's.)"""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    code, site_dir = run_text([str(python), "-c", where])
    if code != 0:
        raise RuntimeError(f"the new venv's Python does not start: {site_dir}")
    ours = [entry for entry in sys.path if entry.endswith(("site-packages", "dist-packages"))]
    (Path(site_dir) / "_gpu_check_base.pth").write_text("".join(f"{entry}\n" for entry in ours))
    return python


def phase_python_env(report: Report, carry: Path, venv: Path) -> Path:
    """A venv on the machine's own packages (torch, NumPy, pip, ...) plus the carried wheels, no index."""
    with report.phase("python_env", 120) as entry:
        python = layered_venv(venv)
        entry["venv"] = str(venv)
        requirements = check_requirements()
        command = [str(python), "-m", "pip", "install", "--no-index", "--disable-pip-version-check"]
        command += ["--find-links", str(carry / WHEELS_NAME), *requirements]
        code, output = run_text(command, timeout=report.remaining() - 30)
        installed = re.findall(r"Successfully installed (.*)", output)
        entry["installed"] = installed[-1].split() if installed else []
        entry["requirements"] = requirements
        if code != 0:
            raise PhaseStop("failed", f"offline install failed (exit {code}):\n{tail(output, 15)}")
        entry["torch"] = torch_probe(str(python))
        return python


def unpack_source(archive: Path, target: Path) -> Path:
    """The archive unpacked once into `target` (same path every run: CMake's build folder refers to it)."""
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    stamp = target / ".unpacked"
    if not (stamp.exists() and stamp.read_text() == digest):
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        with tarfile.open(archive) as source:
            source.extractall(target, filter="data")
        stamp.write_text(digest)
    tops = [path for path in target.iterdir() if path.is_dir()]
    if len(tops) != 1:
        raise ValueError(f"{archive.name} should hold one folder, found {[p.name for p in tops]}")
    return tops[0]


def run_logged(command: list[str], log_path: Path, timeout: float, env: dict[str, str]) -> int | None:
    """Run `command` in its own process group, output to `log_path`; None when it ran out of time (then the
    whole group is killed)."""
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=ROOT
        )
        try:
            return process.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            return None


# What the phases after the build need at least (seconds): model, service, planner, pressure, teardown.
AFTER_BUILD_SECONDS = 170


def phase_engine(report: Report, carry: Path, venv: Path, state: Path, log_dir: Path) -> dict[str, Any]:
    budget = report.remaining() - AFTER_BUILD_SECONDS
    with report.phase("engine", budget) as entry:
        architectures = build_engine.cuda_architectures()
        entry["cuda_architectures"] = architectures
        source = unpack_source(carry / ARCHIVE_NAME, state / "src")
        build_dir = state / f"cmake-build-cuda-{architectures.replace(',', '_') or 'unknown'}"
        env = dict(os.environ, GPU_BACKEND="cuda", CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
        command = [str(venv / "bin" / "python"), str(PACKAGING / "build_engine.py"), "--venv", str(venv)]
        command += ["--source", str(source), "--offline", "--build-dir", str(build_dir)]
        entry["command"] = " ".join(command)
        entry["build_dir"] = str(build_dir)
        entry["resumed"] = (build_dir / "CMakeCache.txt").exists()
        log_path = log_dir / "engine-build.log"
        code = run_logged(command, log_path, budget - 20, env)
        output = log_path.read_text(errors="replace")
        entry["cached"] = "using the cached cuda build" in output
        entry["output_tail"] = tail(output, 30)
        if code is None:
            raise PhaseStop(
                "failed",
                f"the CUDA build needed more than its {budget - 20:.0f} s; CMake's build folder "
                f"{build_dir} is kept: run the same command again while this machine is still up and "
                "the build continues where it stopped",
            )
        if code != 0:
            raise PhaseStop("failed", f"the CUDA build failed (exit {code}):\n{tail(output, 25)}")
        server = build_engine.installed_server(venv)
        if server is None:
            raise PhaseStop("failed", "the build installed no llama-server")
        code, listing = run_text([str(server), "--list-devices"], timeout=60)
        entry["llama_server"] = str(server)
        entry["list_devices"] = tail(listing, 10)
        if "CUDA0" not in listing:
            raise PhaseStop("failed", f"the CUDA build lists no CUDA device:\n{tail(listing, 10)}")
        return entry


def phase_model(report: Report, carry: Path, venv: Path, state: Path) -> Path:
    with report.phase("model", 60) as entry:
        code, found = run_text(
            [
                str(venv / "bin" / "python"),
                "-c",
                "from tray_app import paths; print(paths.bundled_model_path())",
            ],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        if code == 0 and found.strip() not in ("", "None"):
            entry["source"] = "the bundled model (installed)"
            entry["path"] = found.strip()
            return Path(found.strip())
        manifest = json.loads((carry / MANIFEST_NAME).read_text(encoding="utf-8"))
        out = state / "model" / manifest["file_name"].replace(".gguf", ".generated-weights.gguf")
        entry["source"] = "the bundled model's carried skeleton"
        entry.update(rebuild_model(carry / SKELETON_NAME, carry / MANIFEST_NAME, out))
        return out
