"""The view package stays Qt-free: the terminal commands use it on machines with no display libraries."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import tray_app.view


def test_importing_the_view_loads_no_qt() -> None:
    modules = [f"tray_app.view.{info.name}" for info in pkgutil.iter_modules(tray_app.view.__path__)]
    code = "; ".join(f"import {name}" for name in modules) + "; import sys; print('PySide6' in sys.modules)"
    root = Path(tray_app.view.__file__).parents[2]  # this checkout's tray_app, not an installed one
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert modules and result.stdout.strip() == "False", (modules, result.stdout, result.stderr)
