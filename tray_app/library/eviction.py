"""Which loaded models make room for one that does not fit beside them on the GPU.

The rule: only models with no request in flight are unloaded, the least recently used first, and only
as many as the new model needs (in bytes, and within `library.max_loaded`). When even all idle models
would not make room, nothing is unloaded and the caller says why."""

from __future__ import annotations

from dataclasses import dataclass

from tray_app.contract.sizes import format_size


@dataclass(frozen=True)
class Loaded:
    name: str
    vram_bytes: int
    busy: bool  # a request runs on it: never unloaded
    last_used: float  # monotonic time its last request ended (or it loaded)


@dataclass(frozen=True)
class Room:
    evict: tuple[str, ...]  # unload these first, in this order
    fits: bool
    reason: str = ""


def make_room(capacity_bytes: int, max_loaded: int, loaded: list[Loaded], need_bytes: int) -> Room:
    """What to unload so a model of `need_bytes` fits in `capacity_bytes` beside the `loaded` ones and the
    count stays within `max_loaded` (0: no count limit)."""
    if need_bytes > capacity_bytes:
        share = format_size(capacity_bytes)
        return Room((), False, f"it needs {format_size(need_bytes)} and the GPU share for models is {share}")
    used = sum(model.vram_bytes for model in loaded)
    count = len(loaded)
    evict: list[str] = []
    for model in sorted((model for model in loaded if not model.busy), key=lambda model: model.last_used):
        if used + need_bytes <= capacity_bytes and (not max_loaded or count < max_loaded):
            break
        evict.append(model.name)
        used -= model.vram_bytes
        count -= 1
    if used + need_bytes <= capacity_bytes and (not max_loaded or count < max_loaded):
        return Room(tuple(evict), True)
    busy = [model.name for model in loaded if model.busy]
    return Room(
        (), False, f"the models with requests in flight ({', '.join(busy) or 'none'}) leave too little"
    )
