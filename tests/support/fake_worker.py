"""The fake llama-server (fake_llama_server.py) as an executable a supervisor or a service can be pointed
at (`[engine] llama_server`), with the misbehaviour a test chooses."""

from __future__ import annotations

import shlex
import stat
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("fake_llama_server.py")


def fake_llama_server(folder: Path, **env: str | float | int) -> Path:
    """An executable `llama-server` in `folder` that runs the fake with these FAKE_LLAMA_* settings
    (keyword `token_delay=0.1` sets FAKE_LLAMA_TOKEN_DELAY)."""
    exports = "".join(
        f"export FAKE_LLAMA_{name.upper()}={shlex.quote(str(value))}\n" for name, value in env.items()
    )
    executable = folder / "llama-server"
    executable.write_text(
        f'#!/bin/sh\n{exports}exec {shlex.quote(sys.executable)} {shlex.quote(str(SCRIPT))} "$@"\n'
    )
    executable.chmod(executable.stat().st_mode | stat.S_IEXEC)
    return executable
