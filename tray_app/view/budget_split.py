"""The VRAM budget's split as data: the main model's weights, KV cache and compute, a share per other model
loaded on the GPU, reserve, other processes and free, from `/failsoft/status`. No Qt here: the tray's bar and
`failsoft status` show the same segments. A plan is the budget's own dict (sizes in bytes, read by key)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from tray_app.budget.experts import single_tensors_words
from tray_app.contract.sizes import format_size
from tray_app.contract.status import ServiceStatus
from tray_app.view.device_now import device_now, others_bytes, others_detail
from tray_app.view.state import gpu_guests, worker_state


@dataclass(frozen=True)
class Segment:
    key: str
    label: str
    color: str
    bytes: int
    detail: str = ""  # added to the tooltip: another model's own split


# (key, legend label, colour, plan keys summed into it). The output (logits) buffer lives in host memory, so
# it is not part of the device's split.
SEGMENTS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("weights", "Weights", "#3b5bdb", ("weights_bytes",)),
    ("kv", "KV cache", "#0c8599", ("kv_bytes",)),
    ("compute", "Compute", "#e8590c", ("compute_bytes",)),
    ("reserve", "Reserve", "#868e96", ("reserve_bytes",)),
    ("other", "Other processes", "#c2255c", ("other_bytes",)),
    ("free", "Free", "#dee2e6", ("free_bytes",)),
)


MAIN_MODEL_KEYS = ("weights", "kv", "compute")  # the other models' shares are drawn after these
# Each other model on the GPU gets a colour of its own, in the library's order.
MODEL_COLORS = ("#7048e8", "#2f9e44", "#f59f00", "#ae3ec9", "#74b816")


def plan_segments(plan: Mapping[str, Any]) -> list[Segment]:
    """The bar's segments from a plan dict (sizes in bytes); missing keys count as zero."""
    segments = []
    for key, label, color, plan_keys in SEGMENTS:
        total = sum(int(plan.get(name) or 0) for name in plan_keys)
        segments.append(Segment(key, label, color, max(total, 0)))
    return segments


def plan_split(plan: Mapping[str, Any]) -> str:
    """ "Weights 200.00 MiB, KV cache 60.00 MiB, Compute 40.00 MiB": a model's own share, in parts."""
    parts = [s for s in plan_segments(plan) if s.key in MAIN_MODEL_KEYS]
    return ", ".join(f"{s.label} {format_size(s.bytes)}" for s in parts)


def model_segments(status: ServiceStatus) -> list[Segment]:
    """A segment per other model holding GPU memory, labelled with its name."""
    segments = []
    for index, model in enumerate(gpu_guests(status)):
        plan = model.get("plan")
        segments.append(
            Segment(
                f"model:{model['name']}",
                str(model["name"]),
                MODEL_COLORS[index % len(MODEL_COLORS)],
                int(model["vram_bytes"]),
                plan_split(plan) if isinstance(plan, dict) else "",
            )
        )
    return segments


def _index(segments: list[Segment], key: str) -> int:
    return next(i for i, segment in enumerate(segments) if segment.key == key)


def live_segments(segments: list[Segment], status: ServiceStatus) -> list[Segment]:
    """The plan's split with "other processes" as the device watcher reads them now, named: what they
    take beyond the plan's figure comes out of free, then out of the reserve (eaten into: squeezed). While
    the GPU worker is stopped (yielded, or held back for want of memory) its parts are free memory."""
    segments = list(segments)
    if device_now(status).get("watching") and worker_state(status, "gpu") in ("stopped", "failed"):
        freed = sum(s.bytes for s in segments if s.key in MAIN_MODEL_KEYS)
        segments = [replace(s, bytes=0) if s.key in MAIN_MODEL_KEYS else s for s in segments]
        at = _index(segments, "free")
        segments[at] = replace(segments[at], bytes=segments[at].bytes + freed)
    live = others_bytes(status)
    if live is None:
        return segments
    other, free, reserve = (_index(segments, key) for key in ("other", "free", "reserve"))
    more = live - segments[other].bytes
    segments[other] = replace(segments[other], bytes=live, detail=others_detail(status))
    left = segments[free].bytes - more
    if left < 0:
        kept = max(segments[reserve].bytes + left, 0)
        eaten = f"eaten into by other programs: {format_size(kept)} of it left"
        segments[reserve] = replace(segments[reserve], bytes=kept, detail=eaten)
    segments[free] = replace(segments[free], bytes=max(left, 0))
    return segments


def status_segments(status: ServiceStatus) -> list[Segment]:
    """The GPU plan's split, live (`live_segments`), with the other models' shares taken out of the free
    part, so the bar still adds up to the device. When free is short of them, the rest comes out of "other
    processes": a worker that loaded after the device was measured is counted there."""
    segments = live_segments(plan_segments(status.get("plan") or {}), status)
    guests = model_segments(status)
    owed = sum(guest.bytes for guest in guests)
    for key in ("free", "other"):
        index = next(i for i, segment in enumerate(segments) if segment.key == key)
        taken = min(owed, segments[index].bytes)
        segments[index] = replace(segments[index], bytes=segments[index].bytes - taken)
        owed -= taken
    at = len(MAIN_MODEL_KEYS)
    return segments[:at] + guests + segments[at:]


def caps_text(plan: Mapping[str, Any], caps: Mapping[str, int]) -> str:
    """ "Context 8,192 tokens per request · 1 parallel · 30/30 layers on GPU"."""
    n_ctx = caps.get("n_ctx", plan.get("n_ctx"))
    parallel = caps.get("n_parallel", plan.get("n_parallel")) or 1
    per_seq = caps.get("n_ctx_per_seq") or (n_ctx // parallel if n_ctx else 0)
    parts = []
    if per_seq:
        parts.append(f"Context {per_seq:,} per request")
    else:
        parts.append("No GPU context")
    parts.append(f"{parallel} parallel")
    layers, n_layers = plan.get("n_gpu_layers"), plan.get("n_layers")
    if layers is not None and n_layers:
        parts.append(f"{min(int(layers), int(n_layers))}/{n_layers} layers on GPU")
        experts = experts_in_ram_text(plan, int(n_layers) - 1)
        if experts:
            parts.append(experts)
    return " · ".join(parts)


def experts_in_ram_text(plan: Mapping[str, Any], n_blocks: int) -> str:
    """A MoE model's expert split: "experts of 3/8 layers + 1 tensor in RAM (1.25 MiB)"; "" without one."""
    blocks, single = int(plan.get("n_cpu_moe") or 0), len(plan.get("cpu_expert_tensors") or ())
    if not blocks and not single:
        return ""
    size = format_size(int(plan.get("cpu_expert_bytes") or 0))
    return f"experts of {blocks}/{n_blocks} layers{single_tensors_words(single)} in RAM ({size})"


def segment_tip(segment: Segment) -> str:
    tip = f"{segment.label}: {format_size(segment.bytes)}"
    return f"{tip} ({segment.detail})" if segment.detail else tip


# The parts of a remote share's bar: the keys of SEGMENTS, so a box's weights look like the GPU's.
REMOTE_PARTS = ("weights", "kv", "compute", "free")


@dataclass(frozen=True)
class RemoteBar:
    """One RPC box's share of the GPU worker's layers, as a bar of its own: the box's usable memory split
    into what the share takes there and what is left free."""

    key: str  # "rpc:RPC0": llama.cpp's device name, unique in one worker
    label: str  # "RPC0 · nas (192.168.1.30:50052)"
    layers: str  # "5 of 31 layers (blocks 26-29 and the output layer)"
    segments: tuple[Segment, ...]
    used_bytes: int
    total_bytes: int  # usable there: free (or rpc_memory) less the reserve

    @property
    def usage(self) -> str:
        return f"{format_size(self.used_bytes)} of {format_size(self.total_bytes)} usable"


def _rpc(status: Mapping[str, Any]) -> Mapping[str, Any]:
    rpc = status.get("rpc")  # absent from a service older than RPC boxes
    return rpc if isinstance(rpc, Mapping) else {}


def layers_words(share: Mapping[str, Any], plan: Mapping[str, Any]) -> str:
    """ "5 of 31 layers (blocks 26-29 and the output layer)"; without the plan's count, "5 layers (...)"."""
    count, of = int(share.get("n_layers") or 0), int(plan.get("n_layers") or 0)
    noun = "layer" if count == 1 and not of else "layers"  # "1 of 31 layers", "1 layer"
    counted = f"{count} of {of} {noun}" if of else f"{count} {noun}"
    which = share.get("which")  # RemoteShare.which_layers
    return f"{counted} ({which})" if which else counted


def remote_bar(share: Mapping[str, Any], plan: Mapping[str, Any]) -> RemoteBar:
    colors = {key: (label, color) for key, label, color, _keys in SEGMENTS}
    usable = max(int(share.get("usable_bytes") or 0), 0)
    used = {key: max(int(share.get(f"{key}_bytes") or 0), 0) for key in REMOTE_PARTS[:-1]}
    sizes = {**used, "free": max(usable - sum(used.values()), 0)}
    segments = tuple(Segment(key, *colors[key], sizes[key]) for key in REMOTE_PARTS)
    device, peer, endpoint = share.get("device") or "RPC", share.get("peer") or "?", share.get("endpoint")
    return RemoteBar(
        key=f"rpc:{device}",
        label=f"{device} · {peer} ({endpoint})",
        layers=layers_words(share, plan),
        segments=segments,
        used_bytes=sum(used.values()),
        total_bytes=usable,
    )


def remote_bars(status: Mapping[str, Any]) -> list[RemoteBar]:
    """A bar per RPC box that holds some of the GPU worker's layers, in the worker's `--rpc` order."""
    plan = status.get("plan") or {}
    return [remote_bar(share, plan) for share in _rpc(status).get("remote") or ()]


def _unused_why(plan: Mapping[str, Any], shares: list[Mapping[str, Any]]) -> str:
    """Why a box that answers holds nothing: the layers went elsewhere, or none fits in what it offers."""
    on_gpu, n_layers = int(plan.get("n_gpu_layers") or 0), int(plan.get("n_layers") or 0)
    if n_layers and on_gpu + sum(int(share.get("n_layers") or 0) for share in shares) >= n_layers:
        return "the GPU and the other boxes hold every layer" if shares else "the GPU holds every layer"
    if not on_gpu:
        return "the plan puts no layer on the GPU, so none on a box either"
    return "no layer fits in its usable memory"


def box_problems(status: Mapping[str, Any]) -> list[str]:
    """A line per configured RPC box that holds none of the layers, and why: "nas (192.168.1.30:50052): not
    used - the RPC server at ... does not answer"."""
    rpc = _rpc(status)
    shares = list(rpc.get("remote") or ())
    used = {share.get("endpoint") for share in shares}
    lines = []
    for box in rpc.get("boxes") or ():
        if box.get("endpoint") not in used:
            why = box.get("problem") or _unused_why(status.get("plan") or {}, shares)
            lines.append(f"{box.get('peer') or '?'} ({box.get('endpoint')}): not used - {why}")
    return lines
