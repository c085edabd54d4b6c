#!/usr/bin/env python3
"""Build llama-cpp-python and llama.cpp's own `llama-server` in one compile, once per variant, and install it.

llama-cpp-python publishes only a source distribution, and that sdist carries the whole llama.cpp tree it
binds to, `tools/server` included. Its CMake build takes extra arguments (CMAKE_ARGS), so one compile can put
`llama-server` (and its `libllama-server-impl.so`) into the same wheel as the binding, under
`llama_cpp/bin` and `llama_cpp/lib`, linked against the wheel's own ggml and llama libraries: the server and
the binding are the same llama.cpp commit by construction.

The wheel is cached in the user cache dir, one folder per variant: llama-cpp-python version, GPU backend,
the CMake arguments, and the host CPU's features (the default build uses -march=native). pip's own wheel
cache is keyed by the sdist only (pypa/pip#11164), so it would hand a CPU build to a CUDA install: it is not
used. Nothing already built is rebuilt.

Standard library only: `packaging/build_engine.py` runs it before the project itself is installed (a
checkout's `make run`); an installed Failsoft runs it as `failsoft engine build`.

    python3 packaging/build_engine.py --venv .venv            # build if needed, install into .venv
    GPU_BACKEND=cuda python3 packaging/build_engine.py --venv .venv

Offline (no package index, e.g. a machine with a GPU and no network): `--source` names the
llama-cpp-python source to build (an sdist archive or an unpacked one), `--offline` builds with the
interpreter's own build tools (scikit-build-core, CMake, Ninja) and asks no index, and `--build-dir` keeps
CMake's build folder so that an interrupted build continues where it stopped:

    GPU_BACKEND=cuda python3 packaging/build_engine.py --venv V --source SRC --offline --build-dir B
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
BACKENDS = ("cpu", "cuda", "vulkan", "hip")

# Why each argument: the server and its tools on; llama-cpp-python's own LLAVA_BUILD off, because with tools
# on llama.cpp adds tools/mtmd itself ("binary directory ... tools/mtmd is already used"); the web UI neither
# downloaded nor built (the service runs it with --no-webui); no OpenSSL (loopback only); everything
# installed inside the llama_cpp package, found there through RUNPATH.
COMMON_CMAKE_ARGS = (
    "-DLLAVA_BUILD=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_TOOLS_INSTALL=ON",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    # llama.cpp's RPC backend: `rpc-server` for another machine's device, and `llama-server --rpc` to use it.
    "-DGGML_RPC=ON",
    "-DCMAKE_INSTALL_BINDIR=llama_cpp/bin",
    "-DCMAKE_INSTALL_LIBDIR=llama_cpp/lib",
    "-DCMAKE_INSTALL_INCLUDEDIR=llama_cpp/include",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN;$ORIGIN/../lib",
)
BACKEND_CMAKE_ARGS = {
    "cpu": (),
    "cuda": ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=native"),  # the local cards' architectures only
    "vulkan": ("-DGGML_VULKAN=ON",),
    "hip": ("-DGGML_HIP=ON",),
}
# What each backend needs on the build machine, and the Debian/Ubuntu packages (or toolkit) that provide it.
BACKEND_NEEDS = {
    "cuda": (("nvcc",), "the CUDA toolkit (Debian: nvidia-cuda-toolkit, or NVIDIA's cuda-toolkit package)"),
    "vulkan": (("glslc",), "apt-get install libvulkan-dev glslc spirv-headers"),
    "hip": (("hipcc",), "ROCm's HIP SDK (hipcc)"),
}
BUILD_TOOLS = {
    "cmake": "apt-get install cmake",
    "c++": "apt-get install g++",
    "cc": "apt-get install gcc",
}
_STEP = re.compile(r"\[(\d+)/(\d+)\]")


class BuildError(RuntimeError):
    """The engine cannot be built here; the message says what is missing and how to get it."""


def say(text: str) -> None:
    print(f"[engine] {text}", flush=True)


def cache_root() -> Path:
    base = os.environ.get("FAILSOFT_ENGINE_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "failsoft" / "engine"


def _nvidia_gpus() -> bool:
    """An NVIDIA card this machine can use: the driver's device nodes, or nvidia-smi listing one."""
    if any(Path("/dev").glob("nvidia[0-9]*")):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU " in listed.stdout


def _amd_gpus() -> bool:
    return Path("/dev/kfd").exists()


def detect_backend() -> str:
    """The backend to build: GPU_BACKEND when set, else the GPU this machine has and can build for (CUDA with
    an NVIDIA card and nvcc, HIP with an AMD card and hipcc, Vulkan with a render device, glslc and the
    headers), else the CPU. A toolkit alone is not enough: a CUDA build with no card to run it on takes an
    hour to compile and then cannot start."""
    chosen = os.environ.get("GPU_BACKEND", "").strip().lower()
    if chosen and chosen != "auto":
        if chosen not in BACKENDS:
            raise BuildError(f"GPU_BACKEND={chosen!r} is not one of {', '.join(BACKENDS)} or auto")
        return chosen
    if shutil.which("nvcc") and _nvidia_gpus():
        return "cuda"
    if shutil.which("hipcc") and _amd_gpus():
        return "hip"
    vulkan_headers = Path("/usr/include/vulkan/vulkan.h").exists()
    if shutil.which("glslc") and vulkan_headers and any(Path("/dev/dri").glob("renderD*")):
        return "vulkan"
    return "cpu"


def missing_tools(backend: str) -> list[str]:
    missing = [f"{tool} ({fix})" for tool, fix in BUILD_TOOLS.items() if shutil.which(tool) is None]
    if backend in BACKEND_NEEDS:
        tools, fix = BACKEND_NEEDS[backend]
        missing += [f"{tool} ({fix})" for tool in tools if shutil.which(tool) is None]
    return missing


def cpu_features() -> str:
    """The host CPU's feature flags: a -march=native build is only valid on a CPU that has them all."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return os.uname().machine


def cmake_args(backend: str) -> list[str]:
    return [*COMMON_CMAKE_ARGS, *BACKEND_CMAKE_ARGS[backend]]


def cuda_architectures() -> str:
    """The local cards' compute capabilities ("9.0", "8.6,8.9"): a CUDA build for the `native` architectures
    runs only on cards like these, so they are part of its cache key ("" when nvidia-smi cannot say)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        listed = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if listed.returncode != 0:
        return ""
    return ",".join(sorted({line.strip() for line in listed.stdout.splitlines() if line.strip()}))


def variant_dir(version: str, backend: str) -> Path:
    parts = [version, backend, *cmake_args(backend), cpu_features(), os.uname().machine]
    if backend == "cuda":
        parts.append(f"cuda-architectures={cuda_architectures()}")
    key = "\n".join(parts)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_root() / f"llama-cpp-python-{version}-{backend}-{digest}"


def cached_wheel(folder: Path, version: str) -> Path | None:
    wheels = sorted(folder.glob(f"llama_cpp_python-{version}-*.whl"))
    return wheels[-1] if wheels else None


def fetch_sdist(python: str, version: str) -> Path:
    folder = cache_root() / "sdist"
    name = f"llama_cpp_python-{version}.tar.gz"
    if (folder / name).exists():
        return folder / name
    say(f"downloading the llama-cpp-python {version} source (about 77 MB)")
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [*pip_command(python), "download", "--no-deps", "--no-binary", ":all:", "-d", str(folder),
         f"llama-cpp-python=={version}"],
        check=True,
    )  # fmt: skip
    return folder / name


def build_wheel(
    python: str,
    version: str,
    backend: str,
    folder: Path,
    *,
    source: Path | None = None,
    offline: bool = False,
    build_dir: Path | None = None,
) -> Path:
    """Compile the wheel into `folder`. `source`: an sdist archive or unpacked source (default: the cached
    sdist, downloaded once); `offline`: no build isolation and no index (the interpreter's own
    scikit-build-core, CMake and Ninja); `build_dir`: CMake's build folder, kept (an interrupted build
    continues there)."""
    missing = missing_tools(backend)
    if missing:
        raise BuildError("cannot build llama.cpp here; missing: " + "; ".join(missing))
    if source is not None and not source.exists():
        raise BuildError(f"no llama-cpp-python source at {source}")
    sdist = source if source is not None else fetch_sdist(python, version)
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    log_path = staging / "build.log"
    env = dict(os.environ, CMAKE_ARGS=" ".join(cmake_args(backend)))
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    say(f"compiling llama.cpp {backend} (binding + llama-server) from {sdist.name}; log: {log_path}")
    say("about 5 minutes on 2 cores for the CPU build (a GPU backend takes longer), once per variant")
    started = time.monotonic()
    command = _pip_wheel_command(python, staging, sdist, offline, build_dir)
    _compile(command, env, log_path, started)
    wheel = cached_wheel(staging, version)
    if wheel is None:
        raise BuildError(f"the build ended without a wheel in {staging}")
    if folder.exists():
        shutil.rmtree(folder)
    staging.rename(folder)
    say(f"built in {(time.monotonic() - started) / 60:.1f} min: {folder}")
    return folder / wheel.name


def _pip_wheel_command(
    python: str, staging: Path, sdist: Path, offline: bool, build_dir: Path | None
) -> list[str]:
    """pip building the wheel of `sdist` into `staging`; `build_dir` is made here for CMake to keep."""
    command = [*pip_command(python), "wheel", "--no-deps", "--no-cache-dir", "-v", "-w", str(staging)]
    if offline:
        command += ["--no-build-isolation", "--no-index"]
    if build_dir is not None:
        build_dir.mkdir(parents=True, exist_ok=True)
        command.append(f"--config-settings=build-dir={build_dir.resolve()}")
    command.append(str(sdist.resolve()))
    return command


def _compile(command: list[str], env: dict[str, str], log_path: Path, started: float) -> None:
    """Run the build with its output in `log_path`, saying now and then which step it has reached;
    BuildError with the log's last lines when it fails."""
    with (
        log_path.open("w") as log,
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        ) as process,
    ):
        assert process.stdout is not None
        last_shown = 0.0
        for line in process.stdout:
            log.write(line)
            step = _STEP.search(line)
            now = time.monotonic()
            if step and now - last_shown >= 20:
                last_shown = now
                say(f"  step {step.group(1)}/{step.group(2)}, {(now - started) / 60:.1f} min")
    if process.returncode != 0:
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-25:])
        raise BuildError(f"the llama.cpp build failed (exit {process.returncode}); last lines:\n{tail}")


def installed_server(venv: Path) -> Path | None:
    found = list(venv.glob("lib/python3*/site-packages/llama_cpp/bin/llama-server"))
    return found[0] if found else None


def installed_marker(venv: Path) -> Path:
    return venv / ".engine-variant"


def pip_command(python: str) -> list[str]:
    """How to run pip for `python`: its own pip module, else uv's (a uv-made environment has no pip)."""
    probe = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, check=False)
    if probe.returncode == 0:
        return [python, "-m", "pip"]
    uv = shutil.which("uv")
    if uv is not None:
        return [uv, "pip", "--python", python]
    raise BuildError(f"{python} has no pip (`{python} -m ensurepip` adds it)")


def install(venv: Path, wheel: Path, variant: str, python: str | None = None) -> None:
    """Install the cached wheel into the environment at `venv` (its interpreter: `python`, by default
    venv/bin/python) and mark which variant it is; nothing happens when that variant is there already."""
    marker = installed_marker(venv)
    if marker.exists() and marker.read_text().strip() == variant and installed_server(venv):
        say(f"already installed in {venv}: {variant}")
        return
    say(f"installing {wheel.name} into {venv}")
    python = python or str(venv / "bin" / "python")
    # --no-deps: its requirements are Failsoft's own; pip would otherwise ask an index about each.
    subprocess.run(
        [*pip_command(python), "install", "--force-reinstall", "--no-deps", str(wheel)], check=True
    )
    marker.write_text(variant + "\n")


def build_and_install(
    backend: str,
    *,
    version: str = LLAMA_CPP_PYTHON_VERSION,
    venv: Path | None = None,
    python: str | None = None,
    source: Path | None = None,
    offline: bool = False,
    build_dir: Path | None = None,
) -> Path:
    """The cached wheel for `backend`, compiled first when the cache has none, then installed into `venv`
    when one is given. BuildError or CalledProcessError when that cannot be done."""
    folder = variant_dir(version, backend)
    builder = python or (str(venv / "bin" / "python") if venv else sys.executable)
    wheel = cached_wheel(folder, version)
    if wheel is None:
        wheel = build_wheel(
            builder, version, backend, folder, source=source, offline=offline, build_dir=build_dir
        )
    else:
        say(f"using the cached {backend} build: {folder}")
    if venv is not None:
        install(venv, wheel, folder.name, python)
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--venv", type=Path, help="install the wheel into this virtual environment")
    parser.add_argument("--version", default=LLAMA_CPP_PYTHON_VERSION, help="llama-cpp-python version")
    parser.add_argument("--print-dir", action="store_true", help="print the variant's cache folder and exit")
    parser.add_argument(
        "--source", type=Path, help="build from this llama-cpp-python sdist (archive or unpacked folder)"
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="no build isolation, no package index: build with this interpreter's scikit-build-core",
    )
    parser.add_argument("--build-dir", type=Path, help="keep CMake's build folder here (a rerun resumes)")
    args = parser.parse_args(argv)
    try:
        backend = detect_backend()
        folder = variant_dir(args.version, backend)
        if args.print_dir:
            print(folder)
            return 0
        build_and_install(
            backend,
            version=args.version,
            venv=args.venv,
            source=args.source,
            offline=args.offline,
            build_dir=args.build_dir,
        )
    except BuildError as error:
        say(f"error: {error}")
        return 1
    except subprocess.CalledProcessError as error:
        say(f"error: {' '.join(map(str, error.cmd))} failed with exit status {error.returncode}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
