"""CPUs that advertise a feature llama.cpp's CPU backend cannot use safely.

ggml's AMX matrix kernels load a tile configuration once per thread and rely on the kernel saving it across
context switches. Some virtual machines advertise AMX but do not preserve that state: the next tile load
traps and the worker dies with SIGILL in the middle of a generation. On such machines (AMX advertised and
running under a hypervisor) workers run with `--no-repack`, which keeps the weights in plain buffers and the
matrix products on the AVX kernels. FAILSOFT_EXTRA_BUFFERS=1 keeps repacking on regardless.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


@functools.cache
def amx_in_a_virtual_machine() -> bool:
    if os.environ.get("FAILSOFT_EXTRA_BUFFERS") == "1" or not sys.platform.startswith("linux"):
        return False
    flags = _cpu_flags()
    return "amx_tile" in flags and "hypervisor" in flags
