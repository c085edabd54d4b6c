"""Find the `llama-server` binary and check that it is one Failsoft can drive.

By default it is the one built into the installed llama-cpp-python wheel (`llama_cpp/bin/llama-server`, see
`failsoft engine build`), so the server and the binding are the same llama.cpp commit. `[engine]
llama_server` names a user's own build instead (`failsoft engine use PATH`, e.g. a CUDA build); either way its
`--version` and `--help` are read once per binary and a binary that lacks a flag Failsoft passes is refused,
naming the flag.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Every flag the supervisor passes (tray_app.engine.argv); a binary without one of them cannot run a worker.
REQUIRED_FLAGS = (
    "--model",
    "--alias",
    "--host",
    "--port",
    "--ctx-size",
    "--parallel",
    "--n-gpu-layers",
    "--threads",
    "--threads-http",
    "--batch-size",
    "--ubatch-size",
    "--cache-type-k",
    "--cache-type-v",
    "--flash-attn",
    "--fit",
    "--no-webui",
    "--metrics",
    "--jinja",
    "--load-mode",
    "--embeddings",
    "--pooling",
    "--device",
    "--cache-ram",
)
_VERSION = re.compile(r"version:\s*(?P<version>\S+)\s*\(build\s*(?P<build>\d+),\s*commit\s*(?P<commit>\w+)\)")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


class EngineError(RuntimeError):
    """No usable llama-server: the message says what is wrong and what to do."""


@dataclass(frozen=True)
class EngineInfo:
    path: Path
    version: str  # llama.cpp's own version string, e.g. "0.5.0-dev"
    build: int
    commit: str  # the llama.cpp commit the binary was built from, e.g. "0c1e570"
    flags: frozenset[str]

    def describe(self) -> str:
        return f"llama-server {self.version} (commit {self.commit})"

    def to_dict(self) -> dict[str, str | int]:
        return {"path": str(self.path), "version": self.version, "build": self.build, "commit": self.commit}


def bundled_server() -> Path | None:
    """The llama-server inside the installed llama-cpp-python package, if it was built with one."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    candidate = Path(spec.origin).parent / "bin" / "llama-server"
    return candidate if candidate.is_file() else None


def locate(configured: str) -> Path:
    """The binary to run: `configured` (a path) when set, else the bundled one."""
    if configured:
        path = Path(configured).expanduser()
        if not path.is_file():
            raise EngineError(f"engine.llama_server = {configured!r}: no such file")
        return path
    bundled = bundled_server()
    if bundled is None:
        what = (
            "the engine is not installed"
            if importlib.util.find_spec("llama_cpp") is None
            else "llama-cpp-python was installed without llama-server"
        )
        raise EngineError(
            f"{what}: run `failsoft engine build` (one compile for this machine's GPU, then cached), "
            "or `failsoft engine use PATH` for your own llama-server"
        )
    return bundled


def parse_version(text: str) -> tuple[str, int, str] | None:
    match = _VERSION.search(text)
    if match is None:
        return None
    return match["version"], int(match["build"]), match["commit"]


def parse_flags(help_text: str) -> frozenset[str]:
    return frozenset(_FLAG.findall(help_text))


def missing_flags(flags: frozenset[str]) -> list[str]:
    return [flag for flag in REQUIRED_FLAGS if flag not in flags]


def _run(path: Path, argument: str) -> str:
    try:
        done = subprocess.run(
            [str(path), argument], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise EngineError(f"{path} {argument} could not run: {error}") from error
    return done.stdout + done.stderr


@functools.lru_cache(maxsize=8)
def _inspect(path: Path, _mtime_ns: int) -> EngineInfo:
    version = parse_version(_run(path, "--version"))
    if version is None:
        raise EngineError(f"{path} does not look like llama-server: `--version` printed no llama.cpp version")
    flags = parse_flags(_run(path, "--help"))
    missing = missing_flags(flags)
    if missing:
        raise EngineError(
            f"{path} ({version[0]}, commit {version[2]}) lacks flags Failsoft needs: {', '.join(missing)}; "
            "use a newer llama.cpp build, or leave engine.llama_server empty for the bundled one"
        )
    return EngineInfo(path=path, version=version[0], build=version[1], commit=version[2], flags=flags)


def inspect(path: Path) -> EngineInfo:
    """Version and flags of the binary at `path` (read once per file version); EngineError if unusable."""
    try:
        mtime = path.stat().st_mtime_ns
    except OSError as error:
        raise EngineError(f"{path}: {error}") from error
    return _inspect(path, mtime)


def find(configured: str) -> EngineInfo:
    return inspect(locate(configured))


def build_fix() -> str:
    """The command that gives this machine a llama.cpp build with a GPU backend (see the Makefile)."""
    if any(Path("/dev").glob("nvidia[0-9]*")):
        return "install the CUDA toolkit (nvcc), then run `make engine GPU_BACKEND=cuda`"
    if Path("/dev/kfd").exists():
        return "install ROCm's HIP SDK (hipcc), then run `make engine GPU_BACKEND=hip`"
    return (
        "for an NVIDIA card install the CUDA toolkit, then run `make engine GPU_BACKEND=cuda`; for another "
        "card `make engine GPU_BACKEND=vulkan` (needs glslc and libvulkan-dev) or GPU_BACKEND=hip (AMD ROCm)"
    )


def no_gpu_backend_reason() -> str:
    return f"this llama.cpp build has no GPU backend (CPU only): {build_fix()}"
