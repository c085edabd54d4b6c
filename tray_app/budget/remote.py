"""Layers on another machine's device: what the local GPU cannot hold goes to an RPC box (`failsoft rpc serve`
on a peer, `[[peers]] rpc`) before the CPU. Pure functions over the boxes as probed, the model and the local
GPU plan; no I/O.

Where llama.cpp puts them (src/llama.cpp, src/llama-model.cpp load_tensors): the devices are the RPC servers
first, then the local GPUs; `-ngl N` offloads layers n_layer+1-N..n_layer (the output layer is the last) and
`--tensor-split a,b,...` gives each device, in that order, its count of them. So with a local GPU device the
boxes hold the blocks just below the local GPU's, and with none (the simulated device is a CPU build) the
last layers, the output layer with them. The local GPU is filled first: it answers without a network hop per
token; a box takes what does not fit there, in `priority` order, each up to its free memory less the reserve
(and `rpc_memory`), with its share of the KV cache and a compute buffer of its own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tray_app.budget.device import DeviceMemory
from tray_app.budget.fit import budget_for
from tray_app.budget.footprint import kv_cache_bytes
from tray_app.budget.model_info import ModelInfo
from tray_app.budget.plan import MeasuredCompute, Plan, PlanRequest
from tray_app.contract.sizes import format_size


@dataclass(frozen=True)
class RemoteDevice:
    """One configured RPC box as probed now: the device llama.cpp lists there, or why there is none."""

    peer: str  # the [[peers]] name
    endpoint: str  # host:port
    description: str = ""  # as llama.cpp lists it (the endpoint, for the RPC backend)
    total_bytes: int = 0
    free_bytes: int = 0
    cap_bytes: int = 0  # `rpc_memory`: the most the plan may use there (0: no cap)
    problem: str = ""  # why it is not used (does not answer, lists no device)

    @property
    def reachable(self) -> bool:
        return not self.problem and self.total_bytes > 0


@dataclass(frozen=True)
class RemoteShare:
    """The layers one RPC box holds for the GPU worker, and what they take there."""

    peer: str
    endpoint: str
    device: str  # llama.cpp's name for it in the worker: "RPC0", "RPC1" in `--rpc` order
    total_bytes: int
    free_bytes: int
    usable_bytes: int  # free (or rpc_memory) less the reserve
    first_layer: int  # the first of its layers (n_layers: the output layer)
    n_layers: int  # how many: blocks, and the output layer where it is the last
    output: bool  # holds the output layer
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int

    @property
    def used_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes

    @property
    def buffer_name(self) -> str:
        """The name llama.cpp prints for its buffers: "RPC0[192.168.1.20:50052]"."""
        return f"{self.device}[{self.endpoint}]"

    def which_layers(self) -> str:
        """ "blocks 26-29 and the output layer"."""
        blocks = self.n_layers - self.output
        if blocks == 0:
            return "the output layer"
        last = self.first_layer + blocks - 1
        which = f"blocks {self.first_layer}-{last}" if blocks > 1 else f"block {self.first_layer}"
        return which + (" and the output layer" if self.output else "")

    def placement_words(self) -> str:
        return (
            f"{self.n_layers} layers ({self.which_layers()}) on {self.peer}'s device at {self.endpoint}: "
            f"{format_size(self.used_bytes)} of {format_size(self.usable_bytes)} usable "
            f"({format_size(self.weights_bytes)} weights, {format_size(self.kv_bytes)} KV cache, "
            f"{format_size(self.compute_bytes)} compute)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "used_bytes": self.used_bytes,
            "buffer_name": self.buffer_name,
            "which": self.which_layers(),
        }


def answering(boxes: tuple[RemoteDevice, ...]) -> list[tuple[str, bool]]:
    """Which boxes answer: what decides whether a plan made with them still holds."""
    return [(box.endpoint, box.reachable) for box in boxes]


def _layer_bytes(model: ModelInfo, layer: int) -> int:
    return model.output_layer_bytes if layer == model.n_layers else model.layer_bytes[layer]


def _blocks(model: ModelInfo, first: int, count: int) -> range:
    return range(first, min(first + count, model.n_layers))


@dataclass(frozen=True)
class _Taken:
    """What one box takes: `count` layers ending at `end`, in what it may use."""

    box: RemoteDevice
    end: int
    count: int
    usable: int
    compute: int


def _fill(
    model: ModelInfo,
    request: PlanRequest,
    local: Plan,
    box: RemoteDevice,
    end: int,
    left: int,
    measured: MeasuredCompute | None,
) -> _Taken:
    """The most layers below `end` (at most `left`) that fit on `box` with their KV cache and its compute."""
    memory = DeviceMemory(
        box.peer, "nvidia", box.total_bytes, box.free_bytes, box.total_bytes - box.free_bytes, False
    )
    budget = budget_for(memory, model, request, measured)
    # rpc_memory is what the plan may use there, the user's own margin included; else the reserve rule.
    usable = min(box.cap_bytes, box.free_bytes) if box.cap_bytes else budget.usable
    compute = budget.compute(local.n_ctx, local.n_parallel)[0]
    count, need = 0, compute
    while count < left:
        layer = end - count - 1
        cache = kv_cache_bytes(model, local.n_ctx, request, _blocks(model, layer, 1), local.n_parallel)
        if need + _layer_bytes(model, layer) + cache > usable:
            break
        count, need = count + 1, need + _layer_bytes(model, layer) + cache
    return _Taken(box, end, count, usable, compute)


def _share(model: ModelInfo, request: PlanRequest, local: Plan, taken: _Taken, index: int) -> RemoteShare:
    first, box = taken.end - taken.count, taken.box
    return RemoteShare(
        peer=box.peer,
        endpoint=box.endpoint,
        device=f"RPC{index}",
        total_bytes=box.total_bytes,
        free_bytes=box.free_bytes,
        usable_bytes=taken.usable,
        first_layer=first,
        n_layers=taken.count,
        output=taken.end == model.n_layers + 1,
        weights_bytes=sum(_layer_bytes(model, layer) for layer in range(first, taken.end)),
        kv_bytes=kv_cache_bytes(
            model, local.n_ctx, request, _blocks(model, first, taken.count), local.n_parallel
        ),
        compute_bytes=taken.compute,
    )


def remote_shares(
    model: ModelInfo,
    request: PlanRequest,
    local: Plan,
    boxes: list[RemoteDevice],
    *,
    local_device_in_build: bool,
    measured: MeasuredCompute | None = None,
) -> tuple[RemoteShare, ...]:
    """The boxes' shares of what `local` left on the CPU, in the worker's `--rpc` order (empty: none)."""
    all_layers = model.n_layers + 1
    if local.verdict == "cpu" or not 0 < local.n_gpu_layers < all_layers:
        return ()
    # The layers a box may take, highest first: below the local GPU's, or (simulated) from the output down.
    end = all_layers - local.n_gpu_layers if local_device_in_build else all_layers
    left = all_layers - local.n_gpu_layers
    taken: list[_Taken] = []
    for box in (box for box in boxes if box.reachable):
        if left <= 0:
            break
        filled = _fill(model, request, local, box, end, left, measured)
        if filled.count:
            taken.append(filled)
            end, left = end - filled.count, left - filled.count
    # In --rpc order: the box with the lowest layers first.
    return tuple(_share(model, request, local, each, index) for index, each in enumerate(reversed(taken)))
