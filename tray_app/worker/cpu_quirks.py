"""Work around CPUs that advertise a feature llama.cpp's CPU backend cannot use safely.

ggml's AMX matrix kernels load a tile configuration once per thread and rely on the kernel saving it across
context switches. Some virtual machines advertise AMX but do not preserve that state: the next tile load
traps and the worker dies with SIGILL in the middle of a generation. On such machines (AMX advertised and
running under a hypervisor) the worker turns llama.cpp's extra buffer types off, which keeps the weights in
plain buffers and the matrix products on the AVX kernels. FAILSOFT_EXTRA_BUFFERS=1 keeps them on regardless.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def amx_in_a_virtual_machine() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    flags = _cpu_flags()
    return "amx_tile" in flags and "hypervisor" in flags


def disable_extra_buffer_types() -> None:
    """Make every model this process loads use plain buffers (llama_model_params.use_extra_bufts = false)."""
    import llama_cpp.llama_cpp as low_level

    default_params = low_level.llama_model_default_params

    def params_without_extra_buffers() -> Any:
        params = default_params()
        params.use_extra_bufts = False
        return params

    # Llama.__init__ takes its model params from this function; llama-cpp-python exposes no argument for it.
    low_level.llama_model_default_params = params_without_extra_buffers


def apply() -> bool:
    """Apply the workaround where it is needed; True when it was applied."""
    if os.environ.get("FAILSOFT_EXTRA_BUFFERS") == "1" or not amx_in_a_virtual_machine():
        return False
    log.warning("AMX advertised inside a virtual machine: llama.cpp extra buffer types (AMX, repack) are off")
    disable_extra_buffer_types()
    return True
