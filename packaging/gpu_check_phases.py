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
import time
from pathlib import Path
from typing import Any

import build_engine  # the packaging folder's own module (it puts the checkout on sys.path)
import gpu_check_engine
from check_report import PhaseStop, Report, tail
from gpu_check_carry import ARCHIVE_NAME, MANIFEST_NAME, SKELETON_NAME, WHEELS_NAME, check_requirements
from gpu_check_model import rebuild_model

from tray_app.engine_build import build as builder  # standard library only

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
        "engine": gpu_check_engine.carried_manifest(carry),
    }
    if found["engine"] is not None:
        keys = ("arch", "nvcc", "wheel", "bytes", "unpacked_bytes")
        found["engine"] = {key: found["engine"].get(key) for key in keys}
    found["bytes"] = (
        sum(path.stat().st_size for path in carry.rglob("*") if path.is_file()) if carry.exists() else 0
    )
    return found


def machine_identity(state: Path) -> dict[str, Any]:
    """This machine's boot id, and whether an earlier run of the check left its state here (the GPU machine
    is given back 30 s after a call: the next call usually gets a new one, with nothing built)."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = ""
    marker = state / "machine.json"
    earlier: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        earlier = json.loads(marker.read_text(encoding="utf-8"))
    state.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"boot_id": boot_id, "at": time.time()}), encoding="utf-8")
    return {
        "boot_id": boot_id,
        "earlier_run_here": bool(earlier),
        "same_boot_as_earlier_run": bool(earlier) and earlier.get("boot_id") == boot_id,
    }


def phase_host(report: Report, carry: Path, state: Path | None = None) -> dict[str, Any]:
    with report.phase("host") as entry:
        entry["python"] = {"version": platform.python_version(), "executable": sys.executable}
        entry["machine"] = {
            "arch": platform.machine(),
            "cores": os.cpu_count(),
            "system": platform.platform(),
        }
        if state is not None:
            entry["machine"].update(machine_identity(state))
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
        if entry["carried"]["archive"] is None and entry["carried"]["engine"] is None:
            entry["not_prepared"] = (
                f"no carried engine ({carry / gpu_check_engine.ENGINE_NAME}) and no trimmed llama.cpp source "
                f"({carry / ARCHIVE_NAME}): run `python3 packaging/gpu_check.py pack` on a machine with the "
                "network first (`make gpu-check-pack`)"
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
    with report.phase("gpu") as entry:
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
    with report.phase("python_env") as entry:
        python = layered_venv(venv)
        entry["venv"] = str(venv)
        requirements = check_requirements()
        command = [str(python), "-m", "pip", "install", "--no-index", "--disable-pip-version-check"]
        command += ["--find-links", str(carry / WHEELS_NAME), *requirements]
        code, output = run_text(command, timeout=entry["budget_seconds"] - 20)
        installed = re.findall(r"Successfully installed (.*)", output)
        entry["installed"] = installed[-1].split() if installed else []
        entry["requirements"] = requirements
        if code != 0:
            raise PhaseStop("failed", f"offline install failed (exit {code}):\n{tail(output, 15)}")
        entry["torch"] = torch_probe(str(python))
        return python


def unpack_source(archive: Path, target: Path) -> Path:
    """The archive unpacked once into `target` (same path every run: CMake's build folder refers to it)."""
    return gpu_check_engine.unpack_sdist(archive, target)


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


def ninja_steps_done(build_dir: Path) -> int:
    """Build steps an earlier, interrupted build finished (ninja's log of this folder): ninja skips them."""
    log = build_dir / ".ninja_log"
    if not log.exists():
        return 0
    return sum(
        1 for line in log.read_text(errors="replace").splitlines() if line and not line.startswith("#")
    )


def install_carried(
    entry: dict[str, Any], carry: Path, manifest: dict[str, Any], venv: Path, log_dir: Path
) -> None:
    """The engine built where the network is, for this card's architecture: installed, no compiler run (once:
    a second run on the same machine finds it installed)."""
    wheel = carry / gpu_check_engine.ENGINE_NAME / str(manifest["wheel"])
    variant = f"carried-cuda-sm{manifest['arch']}-{manifest['key']}"
    entry["source"] = "carried"
    entry["carried"] = {key: manifest.get(key) for key in ("arch", "key", "nvcc", "wheel", "bytes", "build")}
    marker = builder.installed_marker(venv)
    if marker.exists() and marker.read_text().strip() == variant and builder.installed_server(venv):
        entry["installed"] = "already"
        return
    command = [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "--no-deps"]
    command += ["--force-reinstall", "--disable-pip-version-check", str(wheel)]
    code = run_logged(command, log_dir / "engine-install.log", entry["budget_seconds"] - 20, dict(os.environ))
    if code != 0:
        output = (log_dir / "engine-install.log").read_text(errors="replace")
        raise PhaseStop("failed", f"the carried engine did not install (exit {code}):\n{tail(output, 15)}")
    marker.write_text(variant + "\n")
    entry["installed"] = "now"


def build_on_device(
    entry: dict[str, Any], carry: Path, venv: Path, state: Path, log_dir: Path, arch: str, budget: float
) -> None:
    """The CUDA build from the carried source on this machine. Its build folder is kept per source and
    architecture (and the finished wheel in an engine cache beside it), so the same command on the same
    machine continues where an interrupted build stopped, and a finished one is installed at once. A new
    machine (the GPU machine is given back 30 s after a call) has neither: it builds from step 1."""
    archive = carry / ARCHIVE_NAME
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:12]
    source = unpack_source(archive, state / "src")
    build_dir = state / "engine-build" / f"{digest}-sm{arch.replace(',', '_') or 'unknown'}"
    env = dict(
        os.environ,
        GPU_BACKEND="cuda",
        CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2),
        FAILSOFT_ENGINE_CACHE=str(state / "engine-cache"),
    )
    command = [str(venv / "bin" / "python"), str(PACKAGING / "build_engine.py"), "--venv", str(venv)]
    command += ["--source", str(source), "--offline", "--build-dir", str(build_dir)]
    entry["source"] = "built here"
    entry["command"] = " ".join(command)
    entry["build_dir"] = str(build_dir)
    entry["resumed"] = (build_dir / "CMakeCache.txt").exists()
    entry["steps_done_before"] = ninja_steps_done(build_dir)
    log_path = log_dir / "engine-build.log"
    code = run_logged(command, log_path, budget - 20, env)
    output = log_path.read_text(errors="replace")
    entry["cached"] = "using the cached cuda build" in output
    entry["steps"] = gpu_check_engine.build_steps(output)
    entry["output_tail"] = tail(output, 30)
    if code is None:
        raise PhaseStop(
            "failed",
            f"the CUDA build needed more than its {budget - 20:.0f} s (reached step {entry['steps']}); its "
            f"build folder {build_dir} is kept: the same command on this machine, while it is still up "
            "(it is given back 30 s after a call), continues where it stopped",
        )
    if code != 0:
        raise PhaseStop("failed", f"the CUDA build failed (exit {code}):\n{tail(output, 25)}")


def check_server(entry: dict[str, Any], venv: Path, log_dir: Path) -> str:
    """The installed llama-server: its libraries found (CUDA's put on LD_LIBRARY_PATH if need be) and a CUDA
    device listed; the problem, or "" when there is none."""
    server = build_engine.installed_server(venv)
    if server is None:
        return "the engine installed no llama-server"
    entry["llama_server"] = str(server)
    gpu_check_engine.with_cuda_libraries(gpu_check_engine.engine_files(server), entry)
    if entry["missing_libraries"]:
        return f"libraries not found: {entry['missing_libraries']}"
    code, listing = run_text([str(server), "--list-devices"], timeout=60)
    entry["list_devices"] = tail(listing, 10)
    with (log_dir / "engine-check.log").open("a") as log:
        log.write(json.dumps({key: entry.get(key) for key in ("missing_libraries", "library_dirs")}) + "\n")
        log.write(f"$ llama-server --list-devices (exit {code})\n{listing}\n")
    if "CUDA0" not in listing:
        return f"llama-server lists no CUDA device (exit {code}):\n{tail(listing, 10)}"
    return ""


def phase_engine(report: Report, carry: Path, venv: Path, state: Path, log_dir: Path) -> dict[str, Any]:
    """The carried engine when it was built for this card's architecture, else the build here."""
    with report.phase("engine") as entry:
        capabilities = build_engine.cuda_architectures()
        arch = gpu_check_engine.local_arch(capabilities)
        entry["cuda_architectures"] = capabilities
        manifest = gpu_check_engine.carried_manifest(carry)
        if manifest is not None and manifest.get("arch") == arch:
            install_carried(entry, carry, manifest, venv, log_dir)
            problem = check_server(entry, venv, log_dir)
            if not problem:
                return entry
            entry["carried_failed"] = problem
            report.problem(f"engine: the carried engine does not run here: {problem}")
        else:
            entry["carried_skipped"] = (
                "no engine was carried (`pack` builds one for --cuda-arch)"
                if manifest is None
                else f"the carried engine is for sm_{manifest.get('arch')}, this card is sm_{arch}"
            )
        if not (carry / ARCHIVE_NAME).exists():
            raise PhaseStop("failed", "no carried source to build from (run `pack` first)")
        build_on_device(entry, carry, venv, state, log_dir, arch, entry["budget_seconds"])
        problem = check_server(entry, venv, log_dir)
        if problem:
            raise PhaseStop("failed", problem)
        return entry


def phase_model(report: Report, carry: Path, venv: Path, state: Path) -> Path:
    with report.phase("model") as entry:
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
