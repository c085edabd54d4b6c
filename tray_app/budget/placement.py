"""Two ways to place a model that does not fit whole, weighed by estimated speed.

A layer split leaves whole blocks (and their KV cache) on the CPU; an expert split keeps every block's dense
part and the KV cache on the GPU and leaves only some routed experts in RAM (`--n-cpu-moe`, `-ot`). Where
both fit, the one with more estimated tokens per second wins (tray_app.budget.speed); a tie keeps the layer
split, llama.cpp's plain way. Both are estimated at the same context (the smaller of the two), so that the
split which also leaves room for a longer context is not counted slower for the cache it could hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tray_app.budget.experts import expert_kind
from tray_app.contract.sizes import format_size

Kind = Literal["layers", "experts"]
LABELS: dict[str, str] = {"layers": "layer split", "experts": "expert split"}


@dataclass(frozen=True)
class Candidate:
    kind: Kind
    n_gpu_layers: int
    n_layers: int  # offloadable layers: blocks + the output layer
    n_cpu_moe: int
    n_ctx: int
    fits: bool
    gpu_read_bytes: int  # per generated token, at speed_ctx
    cpu_read_bytes: int
    tokens_per_second: float  # estimated ceiling, at speed_ctx
    speed_ctx: int = 0  # the context the estimate assumed: the same for every candidate of a plan
    cpu_expert_tensors: tuple[str, ...] = ()  # single expert tensors of block n_cpu_moe in RAM
    chosen: bool = False

    @property
    def label(self) -> str:
        return LABELS[self.kind]

    def placement_words(self) -> str:
        if self.kind == "experts":
            blocks = self.n_layers - 1
            extra = (
                f" and block {self.n_cpu_moe}'s {'/'.join(map(expert_kind, self.cpu_expert_tensors))}"
                if self.cpu_expert_tensors
                else ""
            )
            return (
                f"all {self.n_layers} layers, experts of {self.n_cpu_moe}/{blocks} layers{extra} on the CPU"
            )
        if self.n_gpu_layers == 0:
            return "nothing on the GPU"
        return f"{self.n_gpu_layers}/{self.n_layers} layers on the GPU"

    def reads_words(self) -> str:
        return f"{format_size(self.gpu_read_bytes)} GPU + {format_size(self.cpu_read_bytes)} RAM per token"


def choose(candidates: list[Candidate]) -> tuple[int, str]:
    """The index of the placement to run and why, in words. The first candidate is the layer split."""
    fitting = [index for index, candidate in enumerate(candidates) if candidate.fits]
    if not fitting:
        return 0, "neither placement keeps the reserve intact; the layer split is kept"
    best = max(fitting, key=lambda index: candidates[index].tokens_per_second)  # first of equals: layers
    chosen = candidates[best]
    others = [candidate for index, candidate in enumerate(candidates) if index != best]
    against = "; ".join(
        f"the {other.label} {other.tokens_per_second:.0f}" + ("" if other.fits else " (does not fit)")
        for other in others
    )
    return best, (
        f"the {chosen.label} is chosen: about {chosen.tokens_per_second:.0f} tokens/s by memory traffic "
        f"({chosen.reads_words()}), against {against}, both at n_ctx {chosen.speed_ctx}"
    )
