#!/usr/bin/env python3
"""`make gpu-check`: one check of Failsoft on a real NVIDIA GPU, prepared to run offline in one go.

Two modes:

    python3 packaging/gpu_check.py pack   # on a machine with the network (and the project's .venv)
    python3 packaging/gpu_check.py run    # on the GPU machine: needs no network (the default mode)

`pack` writes everything the check needs into `.gpu-check/carry/` (ignored by git, under 64 MiB in all, so it
can travel as one extra path beside the working tree):

- `llama-cpp-src.tar.gz`: llama-cpp-python's sdist trimmed to what a CUDA build of the binding and of
  `llama-server` compiles (no git history, docs, test models, web UI sources, other GPU backends);
- `wheels/`: the Python packages `failsoft serve` needs that a machine with Python, PyTorch and NumPy may
  lack (PySide6 is not among them: the check is headless; NumPy and torch are the machine's own);
- `model-skeleton.gguf.gz` and `model-skeleton.json`: the bundled model's file with its large tensors zeroed
  out (it compresses to a few MiB; the 94 MiB file cannot travel). `run` fills those tensors with generated
  values again: the same file, byte for byte in its layout (every tensor's name, type, shape and offset, the
  tokenizer, the chat template and the real norm weights), with weights that are not the trained ones. The
  planner's figures depend on the layout alone, so they are the bundled model's.

`run` goes as far as this machine allows and writes one JSON report (`$OUT/gpu-check.json` when OUT is
set, else `gpu-check.json`), each phase with its time, its budget and what it found:

  host         Python, cores, compilers, CMake, nvcc, torch, the carried files
  gpu          nvidia-smi and NVML: without an NVIDIA GPU the check stops here (exit status 2)
  python_env   a virtual environment on the machine's own packages plus the carried wheels, offline
  engine       llama.cpp built with CUDA for the local architecture from the carried source (cached by
               architecture; an interrupted build continues on the next run)
  model        the bundled model, or the model rebuilt from the carried skeleton
  service      `failsoft doctor --json`, then `failsoft serve` on the real GPU until both workers are ready
  planner      per buffer: the planner's prediction, llama.cpp's printed sizes and NVML's measurement
  pressure     torch takes the GPU's free memory until a real CUDA allocation fails; then requests of
               growing size until one needs new memory in the GPU worker: it must fail over exactly once
  teardown     the service stopped, its logs kept

Exit status: 0 passed, 1 a phase failed or a check did not hold, 2 no NVIDIA GPU here, 3 not prepared (no
carried source: run `pack` on a machine with the network first).

Standard library only at the top: the phases that need the project run in the check's own environment.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import json
import os
import platform
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
if str(PACKAGING) not in sys.path:
    sys.path.insert(0, str(PACKAGING))

import build_engine  # noqa: E402  (the packaging folder's own module, standard library only)

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_NO_GPU = 2
EXIT_NOT_PREPARED = 3

MIB = 1024 * 1024
WORK = ROOT / ".gpu-check"
CARRY = WORK / "carry"  # what travels to the GPU machine (one `carry` path)
STATE = WORK / "work"  # what the check makes there; kept between runs on the same machine
ARCHIVE_NAME = "llama-cpp-src.tar.gz"
WHEELS_NAME = "wheels"
SKELETON_NAME = "model-skeleton.gguf.gz"
MANIFEST_NAME = "model-skeleton.json"
MAX_ARCHIVE_BYTES = 50 * MIB
MAX_CARRY_BYTES = 64 * MIB  # everything that travels: the carried folder plus the working tree
DEVICE_PYTHON = "3.12"  # the GPU machine's python3
MANYLINUX = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)

# --------------------------------------------------------------------------------------------- pack: source
# Paths in the sdist (below its top folder) that no CUDA build of the binding and llama-server compiles.
SDIST_DROP = (".git/", ".github/", "docs/", "examples/", "tests/", "docker/")
LLAMA_CPP = "vendor/llama.cpp/"
LLAMA_CPP_DROP = (
    ".git",  # the vendored checkout's .git file, .github/, .gitignore, ...
    ".devops/",
    "docs/",  # 37 MB of backend op tables
    "models/",  # tokenizer test models (the build compiles none)
    "benches/",
    "media/",
    "tests/",  # LLAMA_BUILD_TESTS=OFF
    "examples/",  # LLAMA_BUILD_EXAMPLES=OFF
    "pocs/",
    "gguf-py/",
    "conversion/",
    "convert_",
    "ci/",
    "requirements",
    "skills/",
    "grammars/",
    # The web UI's sources (npm); the server is built with --no-webui's placeholder (LLAMA_BUILD_UI=OFF).
    "tools/ui/src/",
    "tools/ui/tests/",
    "tools/ui/package-lock.json",
)
# ggml backends a CUDA build never adds (ggml/src/CMakeLists.txt adds a backend's folder only when enabled);
# CPU and CUDA are built, BLAS and RPC are small and kept.
OTHER_BACKENDS = (
    "cann",
    "et",
    "hexagon",
    "hip",
    "metal",
    "musa",
    "opencl",
    "openvino",
    "sycl",
    "virtgpu",
    "vulkan",
    "webgpu",
    "zdnn",
    "zendnn",
)
LLAMA_CPP_DROP += tuple(f"ggml/src/ggml-{name}/" for name in OTHER_BACKENDS)


def keep_member(name: str) -> bool:
    """Whether the sdist member `name` ("llama_cpp_python-X/...") goes into the trimmed source archive."""
    name = name.removeprefix("./")
    _top, _, rel = name.partition("/")
    if not rel:
        return True  # the top folder itself
    if rel.startswith(SDIST_DROP):
        return False
    if rel.startswith(LLAMA_CPP):
        inner = rel[len(LLAMA_CPP) :]
        if inner.startswith(LLAMA_CPP_DROP):
            return False
    return True


def trim_sdist(sdist: Path, out: Path, keep: Callable[[str], bool] = keep_member) -> dict[str, Any]:
    """Copy the members of `sdist` that `keep` accepts into the gzip'd tar `out`; what was kept, dropped."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    kept = dropped = kept_bytes = dropped_bytes = 0
    dropped_by_folder: dict[str, int] = {}
    commit = ""
    with tarfile.open(sdist) as source, tarfile.open(partial, "w:gz", compresslevel=9) as target:
        for member in source:
            if member.isfile() and member.name.endswith("/.git/modules/vendor/llama.cpp/HEAD"):
                # The trimmed source has no git history: llama.cpp's build then names its commit
                # "unknown", so the commit is kept here.
                commit = source.extractfile(member).read().decode(errors="replace").strip()  # type: ignore[union-attr]
            if keep(member.name):
                data = source.extractfile(member) if member.isfile() else None
                target.addfile(member, data)
                kept += 1
                kept_bytes += member.size
                continue
            dropped += 1
            dropped_bytes += member.size
            parts = member.name.split("/")
            folder = "/".join(parts[1:4] if parts[1:3] == ["vendor", "llama.cpp"] else parts[1:2])
            dropped_by_folder[folder] = dropped_by_folder.get(folder, 0) + member.size
    partial.replace(out)
    largest = sorted(dropped_by_folder.items(), key=lambda item: -item[1])[:12]
    return {
        "sdist": sdist.name,
        "llama_cpp_commit": commit,
        "sdist_bytes": sdist.stat().st_size,
        "archive_bytes": out.stat().st_size,
        "members_kept": kept,
        "members_dropped": dropped,
        "kept_bytes_uncompressed": kept_bytes,
        "dropped_bytes_uncompressed": dropped_bytes,
        "largest_dropped": {folder: size for folder, size in largest},
    }


# --------------------------------------------------------------------------------------------- pack: wheels
# Distributions the check installs itself or finds on the machine, never from the wheelhouse.
NOT_CARRIED = {
    "pyside6-essentials",  # the tray: the check is headless
    "llama-cpp-python",  # built by the check
    "numpy",  # 16 MB; every machine with PyTorch has it
    "torch",
}
# llama-cpp-python's own requirements (its wheel is installed with --no-deps) and its build backend, which
# an offline build (no build isolation) takes from the environment.
ENGINE_REQUIREMENTS = ("typing-extensions>=4.5.0", "diskcache>=5.6.1", "jinja2>=2.11.3")
BUILD_REQUIREMENTS = ("scikit-build-core>=0.9.2",)


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else ""


def check_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """What the check's environment needs (runtime, engine, build), as pip requirement strings."""
    import tomllib

    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    wanted = [req for req in project["dependencies"] if requirement_name(req) not in NOT_CARRIED]
    return [*wanted, *ENGINE_REQUIREMENTS, *BUILD_REQUIREMENTS]


def download_wheels(folder: Path, python_version: str = DEVICE_PYTHON) -> dict[str, Any]:
    """Wheels for the check's requirements and theirs, for CPython `python_version` on x86-64 Linux."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    tag = python_version.replace(".", "")
    command = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(folder)]
    command += ["--python-version", python_version, "--implementation", "cp", "--abi", f"cp{tag}"]
    command += [arg for platform_tag in MANYLINUX for arg in ("--platform", platform_tag)]
    requirements = check_requirements()
    subprocess.run([*command, *requirements], check=True, stdout=subprocess.DEVNULL)
    removed = []
    for wheel in sorted(folder.glob("*.whl")):
        if requirement_name(wheel.name.split("-")[0]) in NOT_CARRIED:
            wheel.unlink()  # pulled in as a dependency (gguf needs NumPy): the machine's own is used
            removed.append(wheel.name)
    wheels = sorted(folder.glob("*.whl"))
    return {
        "python": python_version,
        "requirements": requirements,
        "wheels": [wheel.name for wheel in wheels],
        "bytes": sum(wheel.stat().st_size for wheel in wheels),
        "left_to_the_machine": removed,
    }


# --------------------------------------------------------------------------------------------- the model
# ggml types: (elements per block, bytes per block); the generated ones are filled by `generated_tensor`.
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34),
}
GENERATED_TYPES = ("F16", "Q4_0", "Q4_1", "Q8_0")
_F16 = struct.Struct("<e")


def _f16(value: float) -> bytes:
    return _F16.pack(value)


def _fill_field(buffer: bytearray, stride: int, offset: int, value: bytes) -> None:
    """Write `value` at `offset` of every `stride`-byte block of `buffer` (a block's scale, say)."""
    blocks = len(buffer) // stride
    for index, byte in enumerate(value):
        buffer[offset + index :: stride] = bytes([byte]) * blocks


# F16 values of magnitude 2^-7..2^-5 with a random sign: the high byte keeps the sign and two mantissa bits.
_F16_HIGH = bytes((byte & 0x83) | (8 << 2) for byte in range(256))


def generated_tensor(type_name: str, nbytes: int, rng: random.Random) -> bytes:
    """`nbytes` of valid weights of a ggml type: random quants under small scales (outputs of a sensible
    size, never NaN or infinity)."""
    data = bytearray(rng.randbytes(nbytes))
    if type_name == "F16":
        data[1::2] = bytes(data[1::2]).translate(_F16_HIGH)
    elif type_name == "Q4_0":  # d (f16), 16 bytes of 4-bit quants: w = (q - 8) * d
        _fill_field(data, 18, 0, _f16(0.004))
    elif type_name == "Q4_1":  # d, m (f16), 16 bytes of 4-bit quants: w = q * d + m
        _fill_field(data, 20, 0, _f16(0.004))
        _fill_field(data, 20, 2, _f16(-0.032))
    elif type_name == "Q8_0":  # d (f16), 32 int8 quants: w = q * d
        _fill_field(data, 34, 0, _f16(0.0003))
    else:
        raise ValueError(f"cannot generate ggml type {type_name}")
    return bytes(data)


def pack_model(model: Path, skeleton: Path, manifest_path: Path) -> dict[str, Any]:
    """The model's file with every tensor that can be generated zeroed (gzip'd), and the list of them."""
    from gguf import GGUFReader  # the project's environment has it

    reader = GGUFReader(str(model))
    generated = []
    for tensor in reader.tensors:
        type_name = tensor.tensor_type.name
        if type_name in GENERATED_TYPES:
            offset = int(tensor.data_offset)
            generated.append(
                {"name": tensor.name, "type": type_name, "offset": offset, "nbytes": int(tensor.n_bytes)}
            )
    digest = hashlib.sha256()
    size = model.stat().st_size
    starts = {item["offset"]: item["nbytes"] for item in generated}
    skeleton.parent.mkdir(parents=True, exist_ok=True)
    with model.open("rb") as source, gzip.open(skeleton, "wb", compresslevel=9) as target:
        position = 0
        for start in sorted(starts):
            chunk = source.read(start - position)
            digest.update(chunk)
            target.write(chunk)
            length = starts[start]
            digest.update(source.read(length))
            target.write(bytes(length))
            position = start + length
        rest = source.read()
        digest.update(rest)
        target.write(rest)
    manifest = {
        "file_name": model.name,
        "file_bytes": size,
        "sha256": digest.hexdigest(),
        "seed": 13,
        "tensors": len(reader.tensors),
        "generated": generated,
        "generated_bytes": sum(item["nbytes"] for item in generated),
        "note": "every tensor listed here was zeroed and is generated again (random quants, small scales); "
        "the rest of the file (header, tokenizer, chat template, norm weights) is the bundled model's own",
    }
    manifest_path.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return {k: v for k, v in manifest.items() if k != "generated"} | {
        "skeleton_bytes": skeleton.stat().st_size
    }


def rebuild_model(skeleton: Path, manifest_path: Path, out: Path) -> dict[str, Any]:
    """The model file from its skeleton: the zeroed tensors filled with generated weights (standard library
    only, a second or two for the bundled model)."""
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    rng = random.Random(manifest.get("seed", 13))
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with gzip.open(skeleton, "rb") as source, partial.open("wb") as target:
        shutil.copyfileobj(source, target, 16 * MIB)
    size = partial.stat().st_size
    if size != manifest["file_bytes"]:
        raise ValueError(f"the skeleton unpacks to {size} bytes, the manifest says {manifest['file_bytes']}")
    with partial.open("r+b") as target:
        for item in manifest["generated"]:
            target.seek(item["offset"])
            target.write(generated_tensor(item["type"], item["nbytes"], rng))
    partial.replace(out)
    return {
        "path": str(out),
        "bytes": size,
        "generated_tensors": len(manifest["generated"]),
        "generated_bytes": manifest.get("generated_bytes"),
        "weights": "generated (the bundled model's layout, tokenizer and template; not its trained weights)",
    }


# --------------------------------------------------------------------------------------------- the report
def default_report_path() -> Path:
    out = os.environ.get("OUT")
    return Path(out) / "gpu-check.json" if out else Path("gpu-check.json")


class PhaseStop(Exception):
    """A phase ended the check: `status` says how ("no_gpu", "failed", "not_prepared")."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


class Report:
    """The check's one JSON report, written again after every phase (a killed run leaves what it did)."""

    def __init__(self, path: Path, deadline: float, data: dict[str, Any] | None = None) -> None:
        self.path = path
        self.deadline = deadline  # time.time() by which everything must be over
        self.data: dict[str, Any] = data or {
            "check": "failsoft gpu-check",
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "time_limit_seconds": round(deadline - time.time()),
            "phases": {},
            "problems": [],
            "verdict": "running",
        }

    @classmethod
    def load(cls, path: Path, deadline: float) -> Report:
        return cls(path, deadline, json.loads(path.read_text(encoding="utf-8")))

    @property
    def phases(self) -> dict[str, Any]:
        phases: dict[str, Any] = self.data["phases"]
        return phases

    def problem(self, text: str) -> None:
        self.data["problems"].append(text)

    def remaining(self) -> float:
        return self.deadline - time.time()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2, default=str), encoding="utf-8")

    @contextlib.contextmanager
    def phase(self, name: str, budget: float) -> Iterator[dict[str, Any]]:
        """Run a phase: its entry in the report (to fill), its time and budget; an error ends the check."""
        budget = max(1.0, min(budget, self.remaining()))
        entry: dict[str, Any] = {"status": "running", "budget_seconds": round(budget)}
        self.phases[name] = entry
        say(f"{name}: started (budget {budget:.0f} s)")
        started = time.monotonic()
        try:
            yield entry
        except PhaseStop as stop:
            entry["status"] = stop.status
            entry["message"] = str(stop)
            raise
        except Exception as error:
            entry["status"] = "failed"
            entry["message"] = f"{type(error).__name__}: {error}"
            raise PhaseStop("failed", f"{name}: {type(error).__name__}: {error}") from error
        else:
            if entry["status"] == "running":
                entry["status"] = "ok"
        finally:
            entry["seconds"] = round(time.monotonic() - started, 1)
            if entry["seconds"] > entry["budget_seconds"]:
                entry["over_budget"] = True
            say(f"{name}: {entry['status']} in {entry['seconds']} s")
            self.write()

    def phase_budget(self, name: str) -> float:
        return float(self.phases.get(name, {}).get("budget_seconds", 0))


def say(text: str) -> None:
    print(f"[gpu-check] {text}", file=sys.stderr, flush=True)


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


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------------------------- run: host
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


def sdist_path() -> Path:
    return (
        build_engine.cache_root()
        / "sdist"
        / f"llama_cpp_python-{build_engine.LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    )


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


# --------------------------------------------------------------------------------------------- run: gpu
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


# --------------------------------------------------------------------------------------------- run: python
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


# --------------------------------------------------------------------------------------------- run: engine
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


# --------------------------------------------------------------------------------------------- run: model
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


# --------------------------------------------------------------------------------------------- run
def host_summary(host: dict[str, Any]) -> str:
    """The host phase in one line: what the machine has for the check, and what it lacks."""
    tools = host.get("tools") or {}
    names = ("cmake", "ninja", "c++", "nvcc", "cublas")
    found = [name for name in names if (tools.get(name) or {}).get("path")]
    missing = [name for name in names if name not in found]
    carried = host.get("carried") or {}
    archive = carried.get("archive")
    wheels = carried.get("wheels") or {}
    torch = host.get("torch") or {}
    python, machine = host.get("python") or {}, host.get("machine") or {}
    if archive:
        skeleton = "a model skeleton" if carried.get("model_skeleton") else "no model skeleton"
        carried_text = (
            f"carried {carried.get('bytes', 0) / MIB:.1f} MiB: source archive {archive['bytes'] / MIB:.1f} "
            f"MiB, {wheels.get('count', 0)} wheels, {skeleton}"
        )
    else:
        carried_text = "no carried source (run `pack` first)"
    nvcc = (tools.get("nvcc") or {}).get("version")
    parts = [
        f"host checked: Python {python.get('version')}, {machine.get('cores')} cores",
        "tools "
        + ", ".join(found)
        + (f" (nvcc {nvcc})" if nvcc else "")
        + (f", missing {', '.join(missing)}" if missing else ""),
        carried_text,
        f"torch {torch['version']}" if torch.get("installed") else "torch not installed (no pressure step)",
    ]
    return "; ".join(parts)


def summarize(report: Report) -> int:
    """The verdict, a few lines on stderr, and the exit status."""
    phases = report.phases
    stopped = next(
        (name for name, entry in phases.items() if entry.get("status") not in ("ok", "skipped")), None
    )
    if stopped is not None and phases[stopped].get("status") == "no_gpu":
        verdict, code = "no_gpu", EXIT_NO_GPU
        message = (
            "no NVIDIA GPU here: this check needs one; everything before that point ran: "
            f"{host_summary(phases.get('host') or {})}; GPU: {phases[stopped].get('message')}"
        )
    elif stopped is not None and phases[stopped].get("status") == "not_prepared":
        verdict, code, message = "not_prepared", EXIT_NOT_PREPARED, str(phases[stopped].get("message"))
    elif stopped is not None:
        verdict, code = "failed", EXIT_FAILED
        message = f"stopped in the {stopped} phase: {phases[stopped].get('message')}"
    elif report.data["problems"]:
        verdict, code = "failed", EXIT_FAILED
        message = "ran to the end, but: " + "; ".join(report.data["problems"])
    else:
        verdict, code, message = "passed", EXIT_PASSED, "every phase ran and every check held"
    report.data["verdict"] = verdict
    report.data["message"] = message
    report.data["seconds"] = round(sum(float(entry.get("seconds", 0)) for entry in phases.values()), 1)
    report.write()
    print(f"gpu-check: {verdict}: {message}", file=sys.stderr)
    print(f"gpu-check: report {report.path}", file=sys.stderr)
    return code


def copy_logs(log_dir: Path, report_path: Path) -> None:
    """Logs next to the report when OUT is set (each at most 8 MiB: the end is kept)."""
    if not os.environ.get("OUT") or not log_dir.exists():
        return
    for log in sorted(log_dir.glob("*.log")):
        data = log.read_bytes()[-8 * MIB :]
        (report_path.parent / f"gpu-check-{log.name}").write_bytes(data)


def run(args: argparse.Namespace) -> int:
    deadline = time.time() + args.time_limit
    report = Report(args.report, deadline)
    carry, state = args.carry, args.state
    log_dir = state / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    report.data["carry"] = str(carry)
    try:
        host = phase_host(report, carry)
        phase_gpu(report)
        if not (carry / ARCHIVE_NAME).exists():
            with report.phase("engine", 1):
                raise PhaseStop("not_prepared", str(host.get("not_prepared")))
        python = phase_python_env(report, carry, state / "venv")
        phase_engine(report, carry, state / "venv", state, log_dir)
        model = phase_model(report, carry, state / "venv", state)
        inner = [str(python), str(Path(__file__).resolve()), "_service", "--report", str(report.path)]
        inner += ["--deadline", str(deadline), "--model", str(model), "--state", str(state)]
        say("service, planner and pressure phases run in the check's environment")
        report.write()
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        subprocess.run(inner, cwd=ROOT, env=env, timeout=max(report.remaining(), 10))
        report = Report.load(report.path, deadline)
    except PhaseStop:
        pass
    except subprocess.TimeoutExpired:
        report = Report.load(report.path, deadline)
        report.problem("the service phases ran out of the check's time")
    copy_logs(log_dir, report.path)
    return summarize(report)


def pack(args: argparse.Namespace) -> int:
    """Everything the GPU machine needs, into the carried folder; sizes checked."""
    carry: Path = args.carry
    carry.mkdir(parents=True, exist_ok=True)
    sdist = sdist_path()
    if not sdist.exists():
        sdist = build_engine.fetch_sdist(sys.executable, build_engine.LLAMA_CPP_PYTHON_VERSION)
    summary: dict[str, Any] = {"source": trim_sdist(sdist, carry / ARCHIVE_NAME)}
    say(f"source archive: {summary['source']['archive_bytes'] / MIB:.1f} MiB")
    summary["wheels"] = download_wheels(carry / WHEELS_NAME, args.python_version)
    say(f"wheels: {len(summary['wheels']['wheels'])}, {summary['wheels']['bytes'] / MIB:.1f} MiB")
    sys.path.insert(0, str(ROOT))
    from tray_app import paths

    model = paths.bundled_model_path()
    if model is None:
        say("error: the bundled model is not installed here (make .venv/.installed installs it)")
        return 1
    summary["model"] = pack_model(model, carry / SKELETON_NAME, carry / MANIFEST_NAME)
    say(f"model skeleton: {summary['model']['skeleton_bytes'] / MIB:.1f} MiB")
    total = sum(path.stat().st_size for path in carry.rglob("*") if path.is_file())
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False).stdout
    tree = sum(
        (ROOT / name).stat().st_size
        for name in tracked.decode().split("\0")
        if name and (ROOT / name).is_file()
    )
    summary["carried_bytes"] = total
    summary["working_tree_bytes"] = tree
    (carry / "pack.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(json.dumps(summary, indent=2))
    problems = []
    if summary["source"]["archive_bytes"] > MAX_ARCHIVE_BYTES:
        problems.append(f"the source archive is over {MAX_ARCHIVE_BYTES // MIB} MiB")
    if total + tree > MAX_CARRY_BYTES:
        problems.append(f"the carried folder and the working tree are over {MAX_CARRY_BYTES // MIB} MiB")
    for problem in problems:
        say(f"error: {problem}")
    say(f"carried: {total / MIB:.1f} MiB in {carry} (+ {tree / MIB:.1f} MiB of tracked files)")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", nargs="?", default="run", choices=("run", "pack", "_service"))
    parser.add_argument(
        "--report", type=Path, default=None, help="the JSON report (default: $OUT/gpu-check.json)"
    )
    parser.add_argument("--carry", type=Path, default=CARRY, help="the carried folder")
    parser.add_argument("--state", type=Path, default=STATE, help="where the check builds and runs")
    parser.add_argument("--time-limit", type=float, default=570.0, help="seconds for the whole run")
    parser.add_argument("--python-version", default=DEVICE_PYTHON, help="pack: the GPU machine's Python")
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.report = args.report or default_report_path()
    if args.mode == "pack":
        return pack(args)
    if args.mode == "_service":
        from gpu_check_service import service_phases  # the check's environment: the project is importable

        return service_phases(args.report, args.deadline, args.model, args.state)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
