"""What travels to the GPU machine, and how `pack` makes it: llama-cpp-python's sdist trimmed to what a CUDA
build compiles, and wheels for what the check's environment needs that the machine may lack. Standard library
only."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import build_engine  # the packaging folder's own module

ROOT = Path(__file__).resolve().parent.parent

# The carried folder's files (it travels as one extra path beside the working tree).
ARCHIVE_NAME = "llama-cpp-src.tar.gz"
WHEELS_NAME = "wheels"
SKELETON_NAME = "model-skeleton.gguf.gz"
MANIFEST_NAME = "model-skeleton.json"
DEVICE_PYTHON = "3.12"  # the GPU machine's python3
MANYLINUX = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)
# Paths in the sdist (below its top folder) that no CUDA build of the binding and llama-server compiles.
SDIST_DROP = (".git/", ".github/", "docs/", "examples/", "tests/", "docker/")
LLAMA_CPP = "vendor/llama.cpp/"
LLAMA_CPP_DROP: tuple[str, ...] = (
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


def sdist_path() -> Path:
    return (
        build_engine.cache_root()
        / "sdist"
        / f"llama_cpp_python-{build_engine.LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    )


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
