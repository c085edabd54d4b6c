"""The GPU check's engine: built HERE for the GPU machine's architecture and carried (`pack_engine`), or, when
nothing fitting was carried, built on the GPU machine in a build folder that survives an interrupted run
(`build_on_device`). Standard library only.

Why carried: a CUDA build on the GPU machine took 284 s of a 10-minute lease (16 cores, 414 steps), and a
machine is given back 30 s after a call, so the next call starts bare and builds again from step 1. Built
here once (nvcc 13.0, `--cuda-arch 90` = sm_90 for the H100 and H200) and made fit to carry (`strip_wheel`:
one copy of each library, no build folders in RUNPATH; 28.7 MiB), it travels in `.gpu-check/carry/engine/`
and installs in seconds.

The build is the project's own (`tray_app/engine_build/build.py`, what `failsoft engine build` runs with
GPU_BACKEND=cuda), with three differences that a build for another machine needs, given as its CMake
arguments:

- `CMAKE_CUDA_ARCHITECTURES=<arch>-real` instead of `native` (there is no card here to detect; `-real`: the
  machine code alone, no PTX, which would double the size and be compiled by no one);
- `GGML_NATIVE=OFF`: the CPU backend for x86-64 with AVX2, FMA and F16C, not for this machine's CPU (it has
  AVX-512; the GPU machine's CPU may not: the build would die there with SIGILL);
- cuBLAS and the driver's library to link against: this toolkit has neither. cuBLAS's headers and libraries
  come from NVIDIA's wheel on PyPI (`nvidia-cublas`, unpacked here, never carried: libcublasLt is 540 MB);
  the driver's `libcuda.so.1` is a stub made here from `cuda.h` (as the toolkit's own stubs are), for the
  link only. At run time the GPU machine's own cuBLAS (its PyTorch's `nvidia/cu13/lib`, or its toolkit's)
  and its driver are used.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import build_engine  # the packaging folder's own module (it puts the checkout on sys.path)
from check_report import MIB, say

from tray_app.engine_build import build as builder  # standard library only

ROOT = Path(__file__).resolve().parent.parent
ENGINE_NAME = "engine"  # the carried folder's engine: one wheel and engine.json
ENGINE_MANIFEST = "engine.json"
DEFAULT_CUDA_ARCH = "90"  # H100, H200
CUBLAS_WHEEL = "nvidia-cublas==13.0.2.14"  # CUDA 13.0's cuBLAS (headers and libraries for the link)
CUDA_HOME = Path("/usr/local/cuda")
_STEP = re.compile(r"\[(\d+)/(\d+)\]")


# ------------------------------------------------------------------------------------ here: the toolchain
def nvcc_version() -> str:
    nvcc = shutil.which("nvcc") or str(CUDA_HOME / "bin" / "nvcc")
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return ""
    found = re.search(r"release ([\d.]+), (V[\d.]+)", text)
    return f"{found.group(1)} ({found.group(2)})" if found else ""


def cuda_include() -> Path:
    for folder in (CUDA_HOME / "include", CUDA_HOME / "targets" / "x86_64-linux" / "include"):
        if (folder / "cuda.h").exists():
            return folder
    raise RuntimeError(f"no cuda.h under {CUDA_HOME}: the CUDA toolkit (nvcc) is needed to pack the engine")


def driver_functions(cuda_h: Path) -> list[str]:
    """Every driver API function `cuda.h` declares, by its linked name (`cuMemAlloc` is `cuMemAlloc_v2`):
    the preprocessor resolves the version macros."""
    done = subprocess.run(
        ["cc", "-E", "-P", "-x", "c", "-I", str(cuda_h.parent), str(cuda_h)],
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(set(re.findall(r"\bCUresult\s+(cu[A-Za-z0-9_]+)\s*\(", done.stdout)))


def make_driver_stub(folder: Path) -> Path:
    """`libcuda.so` for the link only (soname libcuda.so.1, every function returning an error): the GPU
    machine's driver provides the real one."""
    stub = folder / "libcuda.so"
    if not stub.exists():
        folder.mkdir(parents=True, exist_ok=True)
        names = driver_functions(cuda_include() / "cuda.h")
        source = folder / "cuda_stub.c"
        source.write_text("".join(f"int {name}(void) {{ return 999; }}\n" for name in names))
        command = ["cc", "-shared", "-fPIC", "-O0", "-Wl,-soname,libcuda.so.1", "-o", str(stub), str(source)]
        subprocess.run(command, check=True)
    # By its soname too: linking a program against libggml-cuda.so looks for libcuda.so.1.
    soname = folder / "libcuda.so.1"
    if not soname.is_symlink() and not soname.exists():
        soname.symlink_to(stub.name)
    return stub


def cublas_here(folder: Path, python: str = sys.executable) -> tuple[Path, Path]:
    """cuBLAS's headers and libraries: the toolkit's when it has them, else NVIDIA's wheel unpacked into
    `folder` (with the unversioned names a link looks for)."""
    for include, lib in (
        (CUDA_HOME / "include", CUDA_HOME / "lib64"),
        (CUDA_HOME / "targets" / "x86_64-linux" / "include", CUDA_HOME / "targets" / "x86_64-linux" / "lib"),
    ):
        if (include / "cublas_v2.h").exists() and (lib / "libcublasLt.so").exists():
            return include, lib
    include, lib = folder / "include", folder / "lib"
    if not (lib / "libcublasLt.so").exists():
        wheels = folder / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        say(f"engine: {CUBLAS_WHEEL} from PyPI (cuBLAS headers and libraries for the link; not carried)")
        subprocess.run(
            [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels),
             "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux2014_x86_64", CUBLAS_WHEEL],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        wheel = next(wheels.glob("nvidia_cublas-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                parts = member.split("/")
                if len(parts) == 4 and parts[:2] == ["nvidia", "cu13"] and parts[2] in ("include", "lib"):
                    target = folder / parts[2] / parts[3]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(member) as source, target.open("wb") as out:
                        shutil.copyfileobj(source, out, 16 * MIB)
        for name in ("libcublas", "libcublasLt"):
            link = lib / f"{name}.so"
            if not link.exists():
                link.symlink_to(f"{name}.so.13")
    return include, lib


def carried_cmake_args(arch: str, include: Path, lib: Path, driver_stub: Path) -> list[str]:
    """The CUDA arguments of a build for `arch` on a machine without its card (see the module's doc)."""
    return [
        "-DGGML_CUDA=ON",
        f"-DCMAKE_CUDA_ARCHITECTURES={arch}-real",
        "-DGGML_NATIVE=OFF",
        f"-DCMAKE_CUDA_FLAGS=-I{include}",
        f"-DCUDA_cublas_LIBRARY={lib / 'libcublas.so'}",
        f"-DCUDA_cublasLt_LIBRARY={lib / 'libcublasLt.so'}",
        f"-DCUDA_cuda_driver_LIBRARY={driver_stub}",
    ]


def engine_key(sdist: Path, arch: str, nvcc: str) -> str:
    """What makes a carried build: the source, the architecture, the compiler, the project's CMake
    arguments."""
    digest = hashlib.sha256()
    digest.update(hashlib.sha256(sdist.read_bytes()).digest())
    for part in (arch, nvcc, *builder.COMMON_CMAKE_ARGS, "GGML_NATIVE=OFF", "-real"):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:12]


@contextlib.contextmanager
def cuda_arguments(args: list[str]) -> Iterator[None]:
    """The engine build's CUDA arguments replaced, in this process only, for one build."""
    saved = builder.BACKEND_CMAKE_ARGS["cuda"]
    builder.BACKEND_CMAKE_ARGS["cuda"] = tuple(args)
    try:
        yield
    finally:
        builder.BACKEND_CMAKE_ARGS["cuda"] = saved


def unpack_sdist(archive: Path, target: Path) -> Path:
    """The archive unpacked once into `target` (the same path every time), and its one top folder."""
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


def ninja_step_seconds(build_dir: Path) -> float:
    """The seconds ninja's log gives the build's steps, added up (two steps at once count twice): the work
    done, whatever the number of attempts."""
    log = build_dir / ".ninja_log"
    if not log.exists():
        return 0.0
    total = 0
    for line in log.read_text(errors="replace").splitlines():
        fields = line.split("\t")
        if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
            total += int(fields[1]) - int(fields[0])
    return round(total / 1000, 1)


def attempt_started(build_dir: Path) -> list[dict[str, float | None]]:
    """This build's attempts so far, one more started now; an attempt that was killed ended when ninja last
    finished a step (its log's time)."""
    path = build_dir / "pack-attempts.json"
    attempts: list[dict[str, float | None]] = []
    with contextlib.suppress(OSError, ValueError):
        attempts = json.loads(path.read_text(encoding="utf-8"))
    log = build_dir / ".ninja_log"
    for attempt in attempts:
        if attempt.get("ended") is None:
            started = float(attempt.get("started") or 0)
            attempt["ended"] = max(started, log.stat().st_mtime if log.exists() else started)
    attempts.append({"started": time.time(), "ended": None})
    build_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(attempts), encoding="utf-8")
    return attempts


def attempt_ended(build_dir: Path, attempts: list[dict[str, float | None]]) -> float:
    """The last attempt ended now; the seconds all of them took."""
    attempts[-1]["ended"] = time.time()
    (build_dir / "pack-attempts.json").write_text(json.dumps(attempts), encoding="utf-8")
    return round(sum(float(a["ended"] or 0) - float(a["started"] or 0) for a in attempts), 1)


def build_steps(log: str) -> str | None:
    """The last "[n/N]" step the build log shows ("414/414" when it ran through)."""
    steps = _STEP.findall(log)
    return f"{steps[-1][0]}/{steps[-1][1]}" if steps else None


# ------------------------------------------------------------------------------------ here: the wheel
def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def is_elf(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def symbol_versions(path: Path, found: dict[str, str]) -> None:
    """The newest GLIBC and GLIBCXX symbol versions `path` needs, folded into `found` (the GPU machine's C
    and C++ libraries must be at least these)."""
    try:
        text = subprocess.run(["objdump", "-T", str(path)], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return
    for name, version in re.findall(r"\b(GLIBC|GLIBCXX)_([\d.]+)\b", text):
        if _version_key(version) > _version_key(found.get(name, "0")):
            found[name] = version


def strip_elf(data: bytes, scratch: Path) -> bytes:
    scratch.write_bytes(data)
    subprocess.run(["strip", "--strip-unneeded", str(scratch)], check=True)
    return scratch.read_bytes()


def dynamic_entries(path: Path) -> dict[str, list[str]]:
    """An ELF file's NEEDED, SONAME and RUNPATH entries (objdump -p)."""
    text = subprocess.run(["objdump", "-p", str(path)], capture_output=True, text=True, timeout=60).stdout
    found: dict[str, list[str]] = {"NEEDED": [], "SONAME": [], "RUNPATH": [], "RPATH": []}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in found:
            found[parts[0]].append(parts[1])
    return found


def without_runpath_under(data: bytes, runpath: str, folder: Path) -> bytes:
    """The ELF file with the RUNPATH entries that point into `folder` removed, in place (the string gets
    shorter and NUL-padded; nothing else moves). The engine's CMake build puts the folders of what it linked
    against (here: the unpacked cuBLAS wheel and the driver stub) into its libraries' RUNPATH."""
    prefix = str(folder.resolve())
    kept = [entry for entry in runpath.split(":") if not entry.startswith(prefix)]
    new = ":".join(kept)
    if new == runpath:
        return data
    old_bytes = runpath.encode() + b"\0"
    if data.count(old_bytes) != 1:
        raise ValueError(f"cannot rewrite a RUNPATH found {data.count(old_bytes)} times: {runpath}")
    return data.replace(old_bytes, new.encode().ljust(len(old_bytes), b"\0"))


def loaded_by_name(sources: dict[str, bytes]) -> set[str]:
    """The libraries llama-cpp-python's own Python loads by name (`load_shared_library("llama", ...)`, or a
    `_lib..._base_name = "mtmd"` it passes): `libllama.so`, `libggml.so`, ..."""
    names: set[str] = set()
    for text in sources.values():
        decoded = text.decode(errors="replace")
        names.update(re.findall(r'load_shared_library\(\s*"([\w-]+)"', decoded))
        names.update(re.findall(r'_base_name\s*=\s*"([\w-]+)"', decoded))
    return {f"lib{name}.so" for name in names}


def copies_to_drop(files: dict[str, bytes], needed: set[str], by_name: set[str]) -> set[str]:
    """The wheel's copies of one library (a wheel holds no symbolic links: `libX.so`, `libX.so.0` and
    `libX.so.0.25.3` are three files) that nothing loads: kept are the names other libraries need (their
    sonames) and the ones the Python package opens itself; at least one copy of each always stays."""
    groups: dict[str, list[str]] = {}
    for name, data in files.items():
        if "/lib/" in name and is_elf(data):
            groups.setdefault(hashlib.sha256(data).hexdigest(), []).append(name)
    drop: set[str] = set()
    for names in groups.values():
        if len(names) < 2:
            continue
        keep = [name for name in names if name.rsplit("/", 1)[-1] in needed | by_name]
        if keep:
            drop.update(name for name in names if name not in keep)
    return drop


def strip_wheel(wheel: Path, out: Path, build_folder: Path | None = None) -> dict[str, Any]:
    """A copy of `wheel` for carrying: its libraries and programs stripped, the copies of a library that
    nothing loads left out, the RUNPATH entries into `build_folder` removed, its RECORD rewritten to match."""
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = out.with_name(out.name + ".strip")
    partial = out.with_name(out.name + ".partial")
    sizes: dict[str, tuple[int, int]] = {}
    needs: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as source:
        infos = {info.filename: info for info in source.infolist()}
        record_name = next(name for name in infos if name.endswith(".dist-info/RECORD"))
        files = {name: source.read(info) for name, info in infos.items() if name != record_name}
    needed: set[str] = set()
    for name, data in files.items():
        if not is_elf(data):
            continue
        before = len(data)
        data = strip_elf(data, scratch)
        entries = dynamic_entries(scratch)
        needed.update(entries["NEEDED"])
        for runpath in entries["RUNPATH"] + entries["RPATH"]:
            if build_folder is not None:
                data = without_runpath_under(data, runpath, build_folder)
        scratch.write_bytes(data)
        symbol_versions(scratch, needs)
        files[name] = data
        sizes[name] = (before, len(data))
    dropped = copies_to_drop(
        files, needed, loaded_by_name({n: d for n, d in files.items() if n.endswith(".py")})
    )
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as target:
        rows = []
        for name, data in files.items():
            if name in dropped:
                continue
            copy = zipfile.ZipInfo(name, infos[name].date_time)
            copy.external_attr = infos[name].external_attr
            copy.compress_type = zipfile.ZIP_DEFLATED
            target.writestr(copy, data, compresslevel=9)
            rows.append([name, _record_hash(data), str(len(data))])
        rows.append([record_name, "", ""])
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows)
        target.writestr(record_name, text.getvalue(), compresslevel=9)
    scratch.unlink(missing_ok=True)
    partial.replace(out)
    kept = {name: data for name, data in files.items() if name not in dropped}
    largest = sorted(kept.items(), key=lambda item: -len(item[1]))[:6]
    return {
        "wheel": out.name,
        "bytes": out.stat().st_size,
        "built_wheel_bytes": wheel.stat().st_size,
        "unpacked_bytes": sum(len(data) for data in kept.values()),
        "unpacked_bytes_as_built": sum(len(data) for name, data in files.items())
        + sum(before - after for before, after in sizes.values()),
        "left_out": sorted(dropped),
        "largest_files": {name: len(data) for name, data in largest},
        "needs_at_least": needs,
    }


def pack_engine(
    carry: Path, work: Path, sdist: Path, arch: str, python: str = sys.executable
) -> dict[str, Any]:
    """The CUDA engine for `arch`, built here once per key (kept in `work`), stripped into `carry/engine/`."""
    nvcc = nvcc_version()
    if not nvcc:
        raise RuntimeError("no nvcc here: the CUDA toolkit is needed to pack the engine (or: --no-engine)")
    key = engine_key(sdist, arch, nvcc)
    built = work / "engine" / f"cuda-sm{arch}-{key}"
    manifest_path = built / "build.json"
    if not manifest_path.exists():
        include, lib = cublas_here(work / "cublas", python)
        stub = make_driver_stub(work / "driver-stub")
        args = carried_cmake_args(arch, include, lib, stub)
        build_dir = work / "engine-build" / f"cuda-sm{arch}-{key}"
        # Unpacked at a fixed path: pip unpacks an archive into a new temporary folder each time, and CMake's
        # build folder is tied to its source folder, so an interrupted build would start again.
        source = unpack_sdist(sdist, work / "src")
        resumed = (build_dir / "CMakeCache.txt").exists()
        say(f"engine: compiling CUDA for sm_{arch} here ({build_dir}; an interrupted build resumes there)")
        attempts = attempt_started(build_dir)
        started = time.monotonic()
        with cuda_arguments(args):
            # Linking the programs needs cuBLAS's libraries found by their sonames.
            saved = os.environ.get("LD_LIBRARY_PATH")
            os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(lib), saved]))
            try:
                wheel = builder.build_wheel(
                    python, build_engine.LLAMA_CPP_PYTHON_VERSION, "cuda", built, source=source,
                    build_dir=build_dir,
                )  # fmt: skip
            finally:
                if saved is None:
                    os.environ.pop("LD_LIBRARY_PATH", None)
                else:
                    os.environ["LD_LIBRARY_PATH"] = saved
        log = (built / "build.log").read_text(errors="replace") if (built / "build.log").exists() else ""
        manifest_path.write_text(
            json.dumps(
                {
                    "wheel": wheel.name,
                    "seconds": attempt_ended(build_dir, attempts),
                    "last_attempt_seconds": round(time.monotonic() - started, 1),
                    "attempts": len(attempts),
                    "step_seconds": ninja_step_seconds(build_dir),
                    "resumed": resumed,
                    "steps": build_steps(log),
                    "cores": os.cpu_count(),
                    "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "cmake_args": [*builder.COMMON_CMAKE_ARGS, *args],
                },
                indent=2,
            ),
            encoding="utf-8",
        )
    build = json.loads(manifest_path.read_text(encoding="utf-8"))
    target = carry / ENGINE_NAME
    shutil.rmtree(target, ignore_errors=True)
    stripped = strip_wheel(built / build["wheel"], target / build["wheel"], work)
    manifest = {
        "arch": arch,
        "key": key,
        "nvcc": nvcc,
        "llama_cpp_python": build_engine.LLAMA_CPP_PYTHON_VERSION,
        "sdist_sha256": hashlib.sha256(sdist.read_bytes()).hexdigest(),
        "build": build,
        **stripped,
        "needs_on_the_gpu_machine": "the NVIDIA driver (libcuda.so.1) and CUDA 13's cuBLAS and runtime "
        "(libcublas.so.13, libcublasLt.so.13, libcudart.so.13: its PyTorch's nvidia wheels or its toolkit)",
    }
    (target / ENGINE_MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return manifest


# ------------------------------------------------------------------------------------ there: install
def local_arch(capabilities: str) -> str:
    """nvidia-smi's compute capabilities ("9.0", "8.6,8.9") as CMake names them ("90", "86,89")."""
    return ",".join(part.strip().replace(".", "") for part in capabilities.split(",") if part.strip())


def carried_manifest(carry: Path) -> dict[str, Any] | None:
    path = carry / ENGINE_NAME / ENGINE_MANIFEST
    if not path.exists():
        return None
    manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    wheel = carry / ENGINE_NAME / str(manifest.get("wheel"))
    return manifest if wheel.exists() else None


def library_dirs(search: list[str] | None = None) -> list[Path]:
    """Where CUDA's libraries may be on the GPU machine: NVIDIA's wheels in this interpreter's site-packages
    (PyTorch's: `nvidia/cu13/lib`, or one folder per library in older ones), then the toolkit's."""
    roots = [Path(entry) for entry in (search if search is not None else sys.path) if entry]
    folders = [folder for root in roots for folder in sorted((root / "nvidia").glob("*/lib"))]
    folders += [CUDA_HOME / "lib64", CUDA_HOME / "targets" / "x86_64-linux" / "lib"]
    return [folder for folder in folders if folder.is_dir()]


def folders_for(names: list[str], search: list[str] | None = None) -> list[Path]:
    """For each library name, the first folder that has it (each folder once)."""
    found: list[Path] = []
    candidates = library_dirs(search)
    for name in names:
        folder = next((folder for folder in candidates if (folder / name).exists()), None)
        if folder is not None and folder.resolve() not in found:
            found.append(folder.resolve())
    return found


def missing_libraries(files: list[Path], env: dict[str, str] | None = None) -> dict[str, list[str]]:
    """Per file, the shared libraries `ldd` cannot find (with the given environment)."""
    missing: dict[str, list[str]] = {}
    for path in files:
        try:
            done = subprocess.run(
                ["ldd", str(path)], capture_output=True, text=True, timeout=30, env=env or dict(os.environ)
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            missing[path.name] = [f"ldd: {error}"]
            continue
        lost = [line.split()[0] for line in done.stdout.splitlines() if "not found" in line]
        if lost:
            missing[path.name] = lost
    return missing


def engine_files(server: Path) -> list[Path]:
    """llama-server and the engine's libraries beside it (llama_cpp/bin, llama_cpp/lib)."""
    lib = server.parent.parent / "lib"
    return [server, *sorted(path for path in lib.glob("*.so*") if path.is_file())]


def with_cuda_libraries(files: list[Path], entry: dict[str, Any]) -> None:
    """When the engine cannot find a library by itself (cuBLAS, the CUDA runtime), the folders that hold
    them go on LD_LIBRARY_PATH, for this run and everything it starts (the service, its workers)."""
    missing = missing_libraries(files)
    entry["missing_libraries"] = missing
    if not missing:
        return
    entry["missing_by_themselves"] = missing
    names = sorted({name for lost in missing.values() for name in lost})
    folders = folders_for(names)
    entry["library_dirs"] = [str(folder) for folder in folders]
    if folders:
        current = os.environ.get("LD_LIBRARY_PATH", "")
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join([*map(str, folders), *filter(None, [current])])
        entry["ld_library_path"] = os.environ["LD_LIBRARY_PATH"]
        entry["missing_libraries"] = missing_libraries(files)
