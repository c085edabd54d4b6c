"""The RAM one model's two workers take at once: the GPU worker's share in RAM beside the CPU worker."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tray_app.budget.plan import Plan
from tray_app.contract.sizes import format_size


@dataclass(frozen=True)
class RamCheck:
    gpu_worker_bytes: int  # what the GPU worker adds in RAM (see both_workers)
    cpu_worker_bytes: int  # the CPU worker's plan: weights, KV cache, compute and logits
    usable_bytes: int  # RAM less what others use and the CPU worker's reserve
    weights_shared: bool

    @property
    def need_bytes(self) -> int:
        return self.gpu_worker_bytes + self.cpu_worker_bytes

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.usable_bytes

    def words(self) -> str:
        shared = " (the model file's pages are shared, counted once)" if self.weights_shared else ""
        gpu, cpu = format_size(self.gpu_worker_bytes), format_size(self.cpu_worker_bytes)
        return (
            f"{format_size(self.need_bytes)} of {format_size(self.usable_bytes)} usable: the GPU worker "
            f"{gpu}{shared}, the CPU worker {cpu} ({'fits' if self.fits else 'DOES NOT FIT'})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "need_bytes": self.need_bytes, "fits": self.fits}


def both_workers(gpu: Plan, cpu: Plan, *, weights_shared: bool) -> RamCheck:
    """The GPU worker's RAM is its weights left there (a layer split's blocks, an expert split's experts,
    the input embedding), the KV cache of its blocks there and its logits. Both workers map the same model
    file unless the GPU worker loads it into its own memory (`--load-mode none`, a simulated device's): then
    `weights_shared` is False. Mapped, the pages are shared and the CPU worker maps every one of them, so the
    GPU worker's weights add nothing beyond them."""
    weights = 0 if weights_shared else gpu.host_weights_bytes
    return RamCheck(
        gpu_worker_bytes=weights + gpu.host_kv_bytes + gpu.output_bytes,
        cpu_worker_bytes=cpu.used_bytes,
        usable_bytes=max(cpu.total_bytes - cpu.other_bytes - cpu.reserve_bytes, 0),
        weights_shared=weights_shared,
    )
