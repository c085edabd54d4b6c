"""What llama.cpp printed about a Mixture-of-Experts load, against Failsoft's plan: pure functions over its
log text.

`make moe-check` (packaging/moe_check.py, the Vulkan build on Mesa's software device) and the GPU check's MoE
phase (packaging/gpu_check_moe.py, CUDA) start llama-server with the plan's command line and read, from the
load log:

    load_tensors: offloaded 9/9 layers to GPU
    tensor blk.0.ffn_gate_exps.weight (4 MiB f16) buffer type overridden to CPU      (-lv 5)
    load_tensors:      Vulkan0 model buffer size =    14.27 MiB
    load_tensors:          CPU model buffer size =    13.00 MiB
    llama_kv_cache:    Vulkan0 KV buffer size =     8.00 MiB
    llama_context:     Vulkan0 compute buffer size =    20.51 MiB

The weights and the KV cache must equal the plan's at the log's precision (two decimals of MiB), the compute
buffer be within COMPUTE_TOLERANCE, the override lines name exactly the experts `--n-cpu-moe` and `-ot` keep
in RAM.
For a placement llama.cpp chose itself (`--fit on`) the same lines give the tensors it left on the CPU, and
`estimate` weighs it with Failsoft's tokens/s estimate (tray_app.budget.speed's model: the bytes a token reads
on each device against its bandwidth), so both placements are ranked by one measure.

Standard library only: the GPU check imports it in its own environment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from llama_buffers import KINDS, last_load, per_backend

MIB = 1024 * 1024
# llama.cpp prints sizes in MiB with two decimals: equal at that precision is equal.
PRINT_SLACK = MIB // 200
COMPUTE_TOLERANCE = 0.05
EXPERT_KINDS = ("gate", "up", "down")

_OVERRIDE = re.compile(
    r"tensor (?P<tensor>\S+) \((?P<mib>\d+) MiB (?P<type>\w+)\) buffer type overridden to (?P<buffer>\S+)"
)
_OFFLOADED = re.compile(r"offloaded (?P<layers>\d+)/(?P<total>\d+) layers to GPU")
_BLOCK = re.compile(r"^blk\.(?P<block>\d+)\.")
_EXPERT = re.compile(r"\.ffn_(?:up|down|gate|gate_up)_(?:ch|)exps\b")


def overrides(log: str) -> dict[str, str]:
    """Tensor name -> the buffer type an override sent it to (printed at debug verbosity, `-lv 5`)."""
    return {match["tensor"]: match["buffer"] for match in _OVERRIDE.finditer(log)}


def offloaded(log: str) -> tuple[int, int] | None:
    """(layers offloaded, offloadable layers) from "offloaded N/M layers to GPU"; None when not printed."""
    found = _OFFLOADED.search(log)
    return (int(found["layers"]), int(found["total"])) if found else None


def expected_overrides(n_layers: int, n_cpu_moe: int, partial: tuple[str, ...] = ()) -> set[str]:
    """The tensors `--n-cpu-moe N` overrides to the CPU, the routed experts of blocks 0..N-1, and those
    `-ot` names of block N (by their stems, "ffn_down_exps"); weights only, as the test model has."""
    whole = {
        f"blk.{block}.ffn_{kind}_exps.weight"
        for block in range(min(n_cpu_moe, n_layers))
        for kind in EXPERT_KINDS
    }
    single = {f"blk.{n_cpu_moe}.{stem}.weight" for stem in partial} if n_cpu_moe < n_layers else set()
    return whole | single


def split_sides(printed: dict[str, dict[str, int]], device: str) -> tuple[dict[str, int], dict[str, int]]:
    """(the device's own buffers, everything else): host memory is "CPU", "CPU_Mapped" and the device
    backend's pinned "<Backend>_Host" buffers alike."""
    empty = dict.fromkeys(KINDS, 0)
    on_device = dict(printed.get(device, empty))
    host = {kind: sum(sizes[kind] for name, sizes in printed.items() if name != device) for kind in KINDS}
    return on_device, host


def row(predicted: int, printed: int, tolerance: float = 0.0) -> dict[str, Any]:
    """One figure against llama.cpp's: exact at the log's precision (tolerance 0), else within a share."""
    difference = predicted - printed
    allowed = max(PRINT_SLACK, round(tolerance * max(printed, predicted)))
    return {
        "planned_mib": round(predicted / MIB, 2),
        "printed_mib": round(printed / MIB, 2),
        "difference_bytes": difference,
        "ratio": round(predicted / printed, 4) if printed else None,
        "tolerance": tolerance,
        "within": abs(difference) <= allowed,
    }


def compare_plan(plan: dict[str, Any], log: str, device: str) -> dict[str, Any]:
    """The plan (Plan.to_dict()) against the load llama.cpp printed for its command line on `device`:
    weights and KV cache on the device and in RAM exactly, the device's compute buffer within
    COMPUTE_TOLERANCE, the offloaded layers and the override lines as planned."""
    load = last_load(log)
    on_device, host = split_sides(per_backend(load), device)
    rows = {
        "weights": row(int(plan["weights_bytes"]), on_device["model"]),
        "host_weights": row(int(plan["host_weights_bytes"]), host["model"]),
        "kv": row(int(plan["kv_bytes"]), on_device["kv"]),
        "host_kv": row(int(plan["host_kv_bytes"]), host["kv"]),
        "compute": row(int(plan["compute_bytes"]), on_device["compute"], COMPUTE_TOLERANCE),
    }
    n_layers = int(plan["n_layers"]) - 1  # blocks: the output layer is the plan's last offloadable layer
    partial = tuple(plan.get("cpu_expert_tensors") or ())
    wanted = expected_overrides(n_layers, int(plan.get("n_cpu_moe") or 0), partial)
    got = {name for name, buffer in overrides(load).items() if not buffer.startswith(device)}
    layers = offloaded(load)
    problems = [
        f"{name}: planned {figures['planned_mib']:.2f} MiB, "
        f"llama.cpp printed {figures['printed_mib']:.2f} MiB"
        + (f" (tolerance {figures['tolerance']:.0%})" if figures["tolerance"] else " (must be equal)")
        for name, figures in rows.items()
        if not figures["within"]
    ]
    if got != wanted:
        missing, extra = sorted(wanted - got), sorted(got - wanted)
        problems.append(f"override lines: missing {missing}, unexpected {extra}")
    if layers is None or layers[0] != min(int(plan["n_gpu_layers"]), layers[1]):
        problems.append(f"offloaded layers: planned {plan['n_gpu_layers']}, llama.cpp printed {layers}")
    return {
        "buffers": rows,
        "offloaded": list(layers) if layers else None,
        "overrides_to_cpu": len(got),
        "overrides_planned": len(wanted),
        "host_compute_mib": round(host["compute"] / MIB, 2),
        "output_mib": round((on_device["output"] + host["output"]) / MIB, 2),
        "problems": problems,
    }


# ------------------------------------------------------------------------------------------------ speed
@dataclass(frozen=True)
class Placement:
    """Where llama.cpp put each weight, from its load log."""

    n_gpu_layers: int  # offloaded layers (blocks from the last, then the output layer)
    n_layers: int  # offloadable layers: blocks + the output layer
    cpu_tensors: frozenset[str]  # tensors of offloaded layers that an override kept in RAM
    kv_device_bytes: int
    kv_host_bytes: int
    device_weights_bytes: int

    @property
    def first_device_block(self) -> int:
        """llama.cpp's i_gpu_start (src/llama-model.cpp): `-ngl N` offloads the output layer first, then the
        last N - 1 blocks."""
        n_blocks = self.n_layers - 1
        return max(n_blocks + 1 - self.n_gpu_layers, 0) if self.n_gpu_layers else n_blocks

    def on_device(self, tensor: str) -> bool:
        if tensor in self.cpu_tensors:
            return False
        block = _BLOCK.match(tensor)
        if (
            block is None
        ):  # outside the blocks: the output layer is offloaded first; the input embedding stays
            return not tensor.startswith("token_embd") and self.n_gpu_layers > 0
        return int(block["block"]) >= self.first_device_block

    def experts_on_cpu(self, n_blocks: int) -> list[int]:
        """The blocks whose routed experts (any of them) stay in RAM, offloaded or not."""
        overridden = {
            int(m["block"]) for name in self.cpu_tensors if _EXPERT.search(name) and (m := _BLOCK.match(name))
        }
        return sorted(overridden | set(range(min(self.first_device_block, n_blocks))))

    def experts_in_ram_by_block(self) -> dict[int, int]:
        """Offloaded blocks -> how many of their expert tensors an override kept in RAM."""
        counts: dict[int, int] = {}
        for name in self.cpu_tensors:
            block = _BLOCK.match(name)
            if block and _EXPERT.search(name):
                counts[int(block["block"])] = counts.get(int(block["block"]), 0) + 1
        return counts

    def words(self) -> str:
        """E.g. "9/9 layers, experts of 3/8 blocks + 1 tensor in RAM" (whole blocks, then single tensors),
        the way Failsoft's plan is put in the same table."""
        n_blocks = self.n_layers - 1
        counts = self.experts_in_ram_by_block()
        whole = min(self.first_device_block, n_blocks) + sum(
            1 for count in counts.values() if count >= len(EXPERT_KINDS)
        )
        single = sum(count for count in counts.values() if count < len(EXPERT_KINDS))
        if not whole and not single:
            return f"{self.n_gpu_layers}/{self.n_layers} layers"
        return f"{self.n_gpu_layers}/{self.n_layers} layers, {experts_words(whole, n_blocks, single)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_gpu_layers": self.n_gpu_layers,
            "n_layers": self.n_layers,
            "cpu_tensors": sorted(self.cpu_tensors),
            "expert_blocks_in_ram": self.experts_on_cpu(self.n_layers - 1),
            "device_weights_mib": round(self.device_weights_bytes / MIB, 2),
            "kv_device_mib": round(self.kv_device_bytes / MIB, 2),
            "kv_host_mib": round(self.kv_host_bytes / MIB, 2),
            "words": self.words(),
        }


def experts_words(whole: int, n_blocks: int, single: int) -> str:
    """ "experts of 3/8 blocks + 1 tensor in RAM": one wording for Failsoft's plan and --fit's placement."""
    tensors = f" + {single} tensor{'s' if single > 1 else ''}" if single else ""
    return f"experts of {whole}/{n_blocks} blocks{tensors} in RAM"


def placement_from_log(log: str, device: str) -> Placement:
    load = last_load(log)
    layers = offloaded(load) or (0, 0)
    on_device, host = split_sides(per_backend(load), device)
    return Placement(
        n_gpu_layers=layers[0],
        n_layers=layers[1],
        cpu_tensors=frozenset(
            name for name, buffer in overrides(load).items() if not buffer.startswith(device)
        ),
        kv_device_bytes=on_device["kv"],
        kv_host_bytes=host["kv"],
        device_weights_bytes=on_device["model"],
    )


def reads_per_token(
    placement: Placement, tensors: dict[str, int], active_share: float, n_parallel: int
) -> tuple[int, int]:
    """(device bytes, RAM bytes) one generated token reads: dense tensors whole, routed experts by the
    share a token is routed to, the input embedding not at all (one row); one sequence's KV cache, half
    full on average. The model of tray_app.budget.speed.reads_per_token, tensor by tensor."""
    device = host = 0
    for name, size in tensors.items():
        if name.startswith("token_embd"):
            continue
        read = round(size * active_share) if _EXPERT.search(name) else size
        if placement.on_device(name):
            device += read
        else:
            host += read
    per_sequence = 2 * max(n_parallel, 1)
    return device + placement.kv_device_bytes // per_sequence, host + placement.kv_host_bytes // per_sequence


def tokens_per_second(
    device_bytes: int, host_bytes: int, device_bandwidth: float, host_bandwidth: float
) -> float:
    seconds = device_bytes / device_bandwidth + host_bytes / host_bandwidth
    return 1 / seconds if seconds > 0 else 0.0


def estimate(
    placement: Placement,
    tensors: dict[str, int],
    active_share: float,
    n_parallel: int,
    bandwidths: tuple[float, float],
) -> dict[str, Any]:
    device, host = reads_per_token(placement, tensors, active_share, n_parallel)
    return {
        "device_read_bytes": device,
        "host_read_bytes": host,
        "tokens_per_second": round(tokens_per_second(device, host, *bandwidths), 1),
    }


def judge_speed(failsoft: float, fit: float | None) -> list[str]:
    """Failsoft's choice must be at least as fast as --fit's by the same estimate (a 0.1 % rounding slack)."""
    if fit is None:
        return ["--fit placed nothing that could be read from its log"]
    if failsoft < fit * 0.999:
        return [f"Failsoft's placement is estimated at {failsoft:.1f} tokens/s, --fit's at {fit:.1f}"]
    return []
