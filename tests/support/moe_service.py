"""A real `failsoft serve --simulate-vram` with the tiny MoE model (tests/support/tiny_moe.py) as its main
model: no reserve percentage, one 1,024-token slot, one CPU thread."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tests.support.helpers import base_settings
from tests.support.service import ServiceHandle, running_service
from tests.support.tiny_moe import write_tiny_moe


@contextlib.contextmanager
def tiny_moe_service(root: Path, *, vram: str, reserve_min: str) -> Iterator[ServiceHandle]:
    """The service in `root` (the model written there) on a simulated device of `vram`, with `reserve_min`
    held back from it."""
    model = write_tiny_moe(root / "tiny-moe.gguf")
    settings = base_settings(
        model={"path": str(model), "name": "tiny-moe"},
        budget={"reserve_percent": 0.0, "reserve_min": reserve_min, "n_ctx": 1024, "n_parallel": 1},
        cpu={"threads": 1},
    )
    with running_service(root / "service", simulate_vram=vram, settings=settings) as handle:
        yield handle
