"""Where a Mixture-of-Experts model's expert tensors go under llama-server's `--n-cpu-moe N` and `-ot`.

`--n-cpu-moe N` adds one CPU override per block 0..N-1 for that block's routed expert tensors
(llm_add_n_cpu_ffn_overrides in common/common.h): the experts of the *first* N blocks stay in system RAM,
whatever `-ngl` offloads. `-ngl` offloads the *last* blocks, so the two meet from opposite ends: with every
layer offloaded, the GPU keeps the dense part of each block, the KV cache, and the experts of the last
n_layers - N blocks. A block's experts are two or three tensors (gate, up, down), so whole blocks leave up to
two thirds of a block's room unused; `-ot 'blk\\.N\\.ffn_down_exps=CPU'` keeps single tensors of block N in
RAM as well, as llama.cpp's own `--fit` does.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from itertools import combinations

from tray_app.budget.model_info import ModelInfo
from tray_app.contract.sizes import format_size
from tray_app.engine.argv import expert_split_args


@dataclass(frozen=True)
class ExpertSplit:
    """The routed experts kept in RAM: all of blocks 0..blocks-1 (`--n-cpu-moe blocks`) and, of block
    `blocks`, the tensors named in `partial` (by their override stems, e.g. "ffn_down_exps")."""

    blocks: int = 0
    partial: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.blocks > 0 or bool(self.partial)


NO_SPLIT = ExpertSplit()


def offloaded_blocks(model: ModelInfo, n_gpu_layers: int) -> range:
    """The blocks `-ngl n_gpu_layers` puts on the GPU: the last n_gpu_layers - 1 ones, the output layer
    taking the first of the count (llama.cpp's i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0))."""
    blocks = min(max(n_gpu_layers - 1, 0), model.n_layers)
    return range(model.n_layers - blocks, model.n_layers)


def output_offloaded(n_gpu_layers: int) -> bool:
    """Whether `-ngl n_gpu_layers` puts the output layer on the GPU: llama.cpp offloads it first, so any
    positive count does (it prints "offloading output layer to GPU")."""
    return n_gpu_layers > 0


def expert_bytes(model: ModelInfo, layer: int) -> int:
    return model.expert_layer_bytes[layer] if model.expert_layer_bytes else 0


def _block_tensors(model: ModelInfo, layer: int) -> tuple[tuple[str, int], ...]:
    return model.expert_tensors[layer] if layer < len(model.expert_tensors) else ()


def experts_in_ram(model: ModelInfo, layer: int, split: ExpertSplit) -> int:
    """Bytes of this block's routed experts that the split keeps in RAM (wherever the block itself is)."""
    if layer < split.blocks:
        return expert_bytes(model, layer)
    if layer == split.blocks and split.partial:
        return sum(size for stem, size in _block_tensors(model, layer) if stem in split.partial)
    return 0


def experts_kept_on_cpu(model: ModelInfo, n_gpu_layers: int, split: ExpertSplit) -> int:
    """Bytes of expert tensors that the split keeps in RAM although their block is offloaded."""
    return sum(experts_in_ram(model, layer, split) for layer in offloaded_blocks(model, n_gpu_layers))


def dense_bytes(model: ModelInfo) -> int:
    """Every weight but the routed experts: what an expert split must fit on the GPU first."""
    return model.weights_bytes - sum(model.expert_layer_bytes)


def partial_splits(model: ModelInfo, blocks: int) -> list[ExpertSplit]:
    """The splits between `blocks - 1` and `blocks` whole blocks in RAM: block blocks-1's experts all in RAM
    but some, fewest bytes in RAM first (of equals: file order). A block with one expert tensor has none."""
    if blocks < 1:
        return []
    block = blocks - 1
    tensors = _block_tensors(model, block)
    stems = [stem for stem, _ in tensors]
    sizes = dict(tensors)
    subsets = [
        subset for count in range(1, len(stems)) for subset in combinations(stems, count)
    ]  # proper, non-empty: all of them is `blocks` whole blocks, none is `blocks - 1`
    subsets.sort(key=lambda subset: sum(sizes[stem] for stem in subset))
    return [ExpertSplit(block, subset) for subset in subsets]


def expert_kind(stem: str) -> str:
    """An override stem in a word: "ffn_down_exps" -> "down", "ffn_gate_up_chexps" -> "gate_up"."""
    return stem.removeprefix("ffn_").replace("_chexps", "").replace("_exps", "")


def single_tensors_words(count: int) -> str:
    """What follows the whole blocks in a short line: " + 1 tensor", " + 2 tensors", or nothing."""
    return f" + {count} tensor{'s' if count > 1 else ''}" if count else ""


def expert_split_words(model: ModelInfo, split: ExpertSplit, cpu_bytes: int) -> str:
    """The split in words, e.g. "experts of 6/24 layers on the CPU: 5.10 GiB in RAM", or with single
    tensors "experts of 3/8 layers and block 3's down experts on the CPU: 20.00 MiB in RAM"."""
    kinds = " and ".join(map(expert_kind, split.partial))
    extra = f" and block {split.blocks}'s {kinds} experts" if split.partial else ""
    return (
        f"experts of {split.blocks}/{model.n_layers} layers{extra} on the CPU: "
        f"{format_size(cpu_bytes)} in RAM"
    )


def split_flag_words(split: ExpertSplit) -> str:
    """The llama-server options for the split, as a user would type them."""
    return shlex.join(expert_split_args(split.blocks, split.partial))
