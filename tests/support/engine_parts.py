"""The jobs engine's shared context for a part tested on its own (an executor, a mirror, an embeddings
runner): the registry's journal and bus, stand-in workers, a relay that scripts the workers' answers."""

from __future__ import annotations

from typing import Any

from tray_app.config import Config
from tray_app.jobs.admission import SlotPool
from tray_app.jobs.context import JobsContext
from tray_app.jobs.registry import JobRegistry


def engine_context(registry: JobRegistry, slots: SlotPool, relay: Any, workers: Any) -> JobsContext:
    """`workers`: role -> worker (or None), as the supervisors' are looked up."""
    return JobsContext(registry, registry.journal, slots, relay, registry.bus, workers, Config)
