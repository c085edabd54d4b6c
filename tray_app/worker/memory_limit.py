"""A real OS memory limit for a worker on a simulated GPU.

On a simulated device the "GPU" worker allocates in host RAM, so nothing stops it from using far more than the
simulated VRAM. RLIMIT_AS caps the worker's whole address space at: what it already maps before the model
loads (interpreter, libraries, thread stacks: measured, not guessed) + the simulated VRAM + a margin. With
the limit in place, a plan far beyond the simulated size fails in a real allocation inside llama.cpp (the
same "failed to allocate ... buffer" path as a real out-of-memory), not just in the after-load check.

What it does not cover: it is an address-space limit, not a VRAM model. Memory-mapped weights count in full,
and so do reserved but untouched pages, which is why the margin is generous; the exact comparison of what
llama.cpp allocated against the simulated VRAM is the after-load check in `simulated.py`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from dataclasses import dataclass

import psutil

# Room for what the worker maps after the baseline: uvicorn and its thread pool (8 MiB stack each),
# llama.cpp's compute threads, malloc arenas (capped at two below) and Python's own heap growth while serving.
MARGIN_BYTES = 1536 * 1024 * 1024
_M_ARENA_MAX = -8

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryLimit:
    baseline_bytes: int
    limit_bytes: int

    def to_dict(self) -> dict[str, int]:
        return {"baseline_bytes": self.baseline_bytes, "limit_bytes": self.limit_bytes}


def _cap_malloc_arenas(arenas: int = 2) -> None:
    # glibc reserves a 64 MiB arena per thread by default: virtual size that would eat the margin for nothing.
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return
    libc = ctypes.CDLL(libc_name)
    if hasattr(libc, "mallopt"):
        libc.mallopt(_M_ARENA_MAX, arenas)


def apply_address_space_limit(simulated_vram_bytes: int) -> MemoryLimit | None:
    """Cap RLIMIT_AS for this process; None where that cannot be done safely (not Linux, lower hard cap)."""
    if not sys.platform.startswith("linux"):
        return None
    import resource

    _cap_malloc_arenas()
    baseline = psutil.Process().memory_info().vms
    limit = baseline + simulated_vram_bytes + MARGIN_BYTES
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY and hard < limit:
        log.warning("RLIMIT_AS hard limit %d is below the planned %d: leaving it as it is", hard, limit)
        return None
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return MemoryLimit(baseline_bytes=baseline, limit_bytes=limit)
