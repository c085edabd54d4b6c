#!/usr/bin/env python3
"""`make run`'s first step: build (or take from the cache) the engine and install it into the checkout's venv,
before Failsoft itself is installed there. The build is `tray_app/engine_build/build.py` (standard library
only), which an installed Failsoft runs as `failsoft engine build`; see that module for the options.

    python3 packaging/build_engine.py --venv .venv
    GPU_BACKEND=cuda python3 packaging/build_engine.py --venv .venv
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Re-exported for packaging/gpu_check.py, which imports this file as a module.
from tray_app.engine_build.build import (  # noqa: E402
    LLAMA_CPP_PYTHON_VERSION,
    BuildError,
    build_and_install,
    cache_root,
    cached_wheel,
    cuda_architectures,
    detect_backend,
    fetch_sdist,
    installed_server,
    main,
    variant_dir,
)

__all__ = [
    "LLAMA_CPP_PYTHON_VERSION",
    "BuildError",
    "build_and_install",
    "cache_root",
    "cached_wheel",
    "cuda_architectures",
    "detect_backend",
    "fetch_sdist",
    "installed_server",
    "main",
    "variant_dir",
]

if __name__ == "__main__":
    sys.exit(main())
