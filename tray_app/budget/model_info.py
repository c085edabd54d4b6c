"""What the planner needs to know about a GGUF model, read with the `gguf` library."""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

from tray_app import paths
from tray_app.budget.gguf_header import GgufError, GgufHeader, read_gguf_header
from tray_app.config import ConfigError

log = logging.getLogger(__name__)
_CACHE_FORMAT = 7
# Already read in this process, by (path, size, mtime): the service re-plans often (config reload, pressure).
_memo: dict[tuple[str, int, int], ModelInfo] = {}
_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.")
# The routed experts as llama.cpp names them for --n-cpu-moe and --cpu-moe (LLM_FFN_EXPS_REGEX in
# common/common.h, matched with regex_search): the router (ffn_gate_inp) and shared experts (*_shexp) are
# dense, every token reads them.
EXPERT_TENSOR = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")
_READ_ERRORS = (OSError, ValueError, IndexError, KeyError, TypeError, OverflowError)
# Architectures whose sliding-window layers llama.cpp caches apart, each in a window-sized cache
# (llama_kv_cache_iswa), with the pattern it assumes when the file names none: every n-th layer attends to the
# whole context, the others to the last `sliding_window` tokens. Checked against the KV buffers llama-server
# prints. Other architectures with a sliding window are planned with full-size caches: more than llama.cpp
# allocates, never less.
SWA_PATTERNS = {"gemma3": 6}


class ModelFileError(ConfigError):
    """The model file is missing, not GGUF, truncated or lacks what the planner needs; the message names it.
    A ConfigError: the fix is the config's (or --model's) path, and the commands report it as one."""


@dataclass(frozen=True)
class ModelInfo:
    path: str
    architecture: str
    n_layers: int  # repeating blocks ("block_count")
    n_embd: int
    n_head: int
    n_head_kv: tuple[int, ...]  # per layer; a scalar in the file is expanded
    head_dim_k: int
    head_dim_v: int
    n_ctx_train: int
    n_vocab: int
    n_ff: int  # feed-forward width (largest layer)
    file_bytes: int
    layer_bytes: tuple[int, ...]  # tensor bytes of each repeating layer
    non_layer_bytes: int  # token embedding, output, norms and anything else outside the blocks
    input_bytes: int  # what llama.cpp keeps on the CPU as the input layer (token embedding)
    output_layer_bytes: int  # what goes to the output device: output norm + output (the embedding when tied)
    tied_embeddings: bool  # no output matrix in the file: llama.cpp copies the token embedding for the output
    chat_template: str = ""  # the model's own Jinja chat template ("tokenizer.chat_template"), if any
    n_swa: int = 0  # the sliding window in tokens of the layers flagged in swa_layers
    swa_layers: tuple[bool, ...] = ()  # per layer: attends to a sliding window only; empty: no such layer
    n_expert: int = 0  # routed experts per block ("expert_count"); 0: a dense model
    n_expert_used: int = 0  # experts each token goes through ("expert_used_count", the largest per block)
    expert_layer_bytes: tuple[int, ...] = ()  # per block: its routed experts' bytes (part of layer_bytes)
    expert_tensor_max_bytes: int = 0  # the largest single expert tensor
    # Per block: its routed expert tensors as an override pattern names them ("ffn_down_exps", a weight and
    # its bias together) with their bytes, in file order; what an expert split places one by one.
    expert_tensors: tuple[tuple[tuple[str, int], ...], ...] = ()
    # Feed-forward rows one token goes through in an MoE block: its routed experts' widths plus the shared
    # experts'; what the compute buffer holds per token (0: a dense model, n_ff counts there).
    moe_ff_width: int = 0

    @property
    def weights_bytes(self) -> int:
        """All tensor bytes in the file (what a CPU-only load maps)."""
        return sum(self.layer_bytes) + self.non_layer_bytes

    @property
    def is_moe(self) -> bool:
        """Mixture of Experts: blocks with routed expert tensors that can live apart from the rest."""
        return self.n_expert > 0 and self.n_expert_used > 0 and any(self.expert_layer_bytes)

    @property
    def active_expert_share(self) -> float:
        """The share of a block's expert bytes one token reads: 1 for a dense model."""
        return min(self.n_expert_used / self.n_expert, 1.0) if self.is_moe else 1.0

    @property
    def name(self) -> str:
        return Path(self.path).name

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["n_head_kv"] = list(self.n_head_kv)
        data["swa_layers"] = list(self.swa_layers)
        data["layer_bytes"] = list(self.layer_bytes)
        data["expert_layer_bytes"] = list(self.expert_layer_bytes)
        data["expert_tensors"] = [[list(group) for group in block] for block in self.expert_tensors]
        data["weights_bytes"] = self.weights_bytes
        return data


def _field(reader: GgufHeader, key: str) -> Any:
    return reader.fields.get(key)


def _required_int(reader: GgufHeader, path: Path, key: str) -> int:
    value = _field(reader, key)
    if value is None:
        raise ModelFileError(f"{path}: GGUF metadata lacks {key}")
    return int(max(value) if isinstance(value, list) else value)


def _per_layer(value: Any, n_layers: int, default: int) -> tuple[int, ...]:
    if value is None:
        return (default,) * n_layers
    if isinstance(value, list):
        if len(value) != n_layers:
            raise ValueError(f"per-layer value has {len(value)} entries for {n_layers} layers")
        return tuple(int(v) for v in value)
    return (int(value),) * n_layers


def _swa_layers(pattern: Any, n_layers: int, default_pattern: int) -> tuple[bool, ...]:
    """Which layers use the sliding window, as llama.cpp decides (load_swa_pattern): a per-layer list in the
    file, else every n-th layer (n from the file, else the architecture's) attends to everything."""
    if isinstance(pattern, list):
        if len(pattern) != n_layers:
            raise ValueError(f"sliding window pattern has {len(pattern)} entries for {n_layers} layers")
        return tuple(bool(v) for v in pattern)
    n_pattern = default_pattern if pattern is None else int(pattern)
    return tuple(n_pattern == 0 or layer % n_pattern < n_pattern - 1 for layer in range(n_layers))


def _open(path: Path) -> GgufHeader:
    if not path.is_file():
        raise ModelFileError(f"{path}: model file not found")
    with path.open("rb") as stream:
        magic = stream.read(4)
    if magic != b"GGUF":
        raise ModelFileError(f"{path}: not a GGUF file (it starts with {magic!r}, a GGUF file with b'GGUF')")
    try:
        return read_gguf_header(path)
    except (*_READ_ERRORS, GgufError) as error:
        # A short file leaves the reader a short header, or tensors past its end: the file was cut off.
        raise ModelFileError(f"{path}: truncated or damaged GGUF file ({error})") from None


@dataclass
class _TensorTable:
    """The tensor table's bytes, by where llama.cpp places them."""

    layer_bytes: list[int]
    expert_bytes: list[int]  # per block, the routed experts among its layer bytes
    others: dict[str, int]  # outside the blocks, by name
    expert_tensor_max: int = 0
    expert_groups: list[dict[str, int]] = field(default_factory=list)  # per block: pattern stem -> bytes

    @property
    def non_layer_bytes(self) -> int:
        return sum(self.others.values())

    @property
    def input_bytes(self) -> int:
        return self.others.get("token_embd.weight", 0)

    @property
    def tied_embeddings(self) -> bool:
        return "output.weight" not in self.others

    @property
    def output_layer_bytes(self) -> int:
        output = sum(
            size for name, size in self.others.items() if name.startswith(("output.", "output_norm."))
        )
        # Tied: llama.cpp duplicates the embedding on the output device.
        return output + self.input_bytes if self.tied_embeddings else output

    @property
    def expert_layer_bytes(self) -> tuple[int, ...]:
        return tuple(self.expert_bytes) if any(self.expert_bytes) else ()

    @property
    def expert_tensors(self) -> tuple[tuple[tuple[str, int], ...], ...]:
        return tuple(tuple(groups.items()) for groups in self.expert_groups) if any(self.expert_bytes) else ()


def _tensor_bytes(tensors: Sequence[Any], n_layers: int) -> _TensorTable:
    table = _TensorTable([0] * n_layers, [0] * n_layers, {}, 0, [{} for _ in range(n_layers)])
    for tensor in tensors:
        size = int(tensor.n_bytes)
        match = _LAYER_TENSOR.match(tensor.name)
        if not (match and int(match.group(1)) < n_layers):
            table.others[tensor.name] = size
            continue
        layer = int(match.group(1))
        table.layer_bytes[layer] += size
        expert = EXPERT_TENSOR.search(tensor.name)
        if expert:
            table.expert_bytes[layer] += size
            table.expert_tensor_max = max(table.expert_tensor_max, size)
            stem = expert.group(0).lstrip(".")
            table.expert_groups[layer][stem] = table.expert_groups[layer].get(stem, 0) + size
    return table


def _cache_file(path: Path) -> Path:
    stat = path.stat()
    return paths.data_dir() / "model_info" / f"{path.name}-{stat.st_size}-{stat.st_mtime_ns}.json"


def _cached(path: Path) -> ModelInfo | None:
    try:
        data = json.loads(_cache_file(path).read_text(encoding="utf-8"))
        if data.pop("format", None) != _CACHE_FORMAT:
            return None
        data = {f.name: data[f.name] for f in fields(ModelInfo)}
        data.update(
            path=str(path),
            n_head_kv=tuple(data["n_head_kv"]),
            layer_bytes=tuple(data["layer_bytes"]),
            swa_layers=tuple(data["swa_layers"]),
            expert_layer_bytes=tuple(data["expert_layer_bytes"]),
            expert_tensors=tuple(
                tuple((str(stem), int(size)) for stem, size in block) for block in data["expert_tensors"]
            ),
        )
        return ModelInfo(**data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as error:
        log.warning("ignoring unreadable model info cache for %s: %s", path, error)
        return None


def _store(path: Path, info: ModelInfo) -> None:
    target = _cache_file(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump({"format": _CACHE_FORMAT, **info.to_dict()}, stream)
        os.replace(temporary, target)
    except OSError as error:
        log.warning("could not cache model info for %s: %s", path, error)


def inspect_model(path: str | Path, *, use_cache: bool = True) -> ModelInfo:
    """Read the GGUF header and tensor table; ModelFileError (naming the file) when that is not possible.

    Reading a large vocabulary takes seconds, so the result is kept in the data dir, keyed by the file's
    name, size and modification time; `use_cache=False` reads the file regardless.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: model file not found")
    if not use_cache:
        return _inspect(path)
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _memo:
        found = _cached(path)
        if found is None:
            found = _inspect(path)
            _store(path, found)
        _memo[key] = found
    return _memo[key]


def _attention_heads(
    reader: GgufHeader, path: Path, arch: str, n_layers: int, n_embd: int
) -> tuple[int, tuple[int, ...], int, int]:
    """(n_head, n_head_kv per layer, head_dim_k, head_dim_v)."""
    head_counts = _per_layer(_field(reader, f"{arch}.attention.head_count"), n_layers, 0)
    n_head = head_counts[0] if head_counts else 0
    if n_head <= 0:
        raise ModelFileError(f"{path}: GGUF metadata lacks {arch}.attention.head_count")
    n_head_kv = _per_layer(_field(reader, f"{arch}.attention.head_count_kv"), n_layers, n_head)
    # llama.cpp's default when the file does not say: the embedding split evenly over the heads.
    head_dim_k = int(_field(reader, f"{arch}.attention.key_length") or n_embd // n_head)
    head_dim_v = int(_field(reader, f"{arch}.attention.value_length") or n_embd // n_head)
    return n_head, n_head_kv, head_dim_k, head_dim_v


def _vocab_size(reader: GgufHeader, arch: str) -> int:
    tokens = _field(reader, "tokenizer.ggml.tokens")
    return int(_field(reader, f"{arch}.vocab_size") or (len(tokens) if tokens is not None else 0))


def _sliding_window(reader: GgufHeader, arch: str, n_layers: int) -> tuple[int, tuple[bool, ...]]:
    """(the window in tokens, which layers use it); (0, ()) where no layer does, or llama.cpp does not cache
    this architecture's window layers apart (SWA_PATTERNS)."""
    n_swa = int(_field(reader, f"{arch}.attention.sliding_window") or 0) if arch in SWA_PATTERNS else 0
    if n_swa <= 0:
        return 0, ()
    pattern = _field(reader, f"{arch}.attention.sliding_window_pattern")
    swa_layers = _swa_layers(pattern, n_layers, SWA_PATTERNS[arch])
    return (n_swa, swa_layers) if any(swa_layers) else (0, ())


class _Experts(NamedTuple):
    """A Mixture of Experts' counts and widths as the file states them (all 0 for a dense model)."""

    n_expert: int  # routed experts per block
    n_expert_used: int  # experts each token goes through (the largest per block)
    n_ff_expert: int  # one routed expert's feed-forward width (0: the model's n_ff)
    shared_ff: int  # a shared expert's feed-forward width
    shared_count: int

    @classmethod
    def read(cls, reader: GgufHeader, arch: str) -> _Experts:
        n_expert = int(_field(reader, f"{arch}.expert_count") or 0)
        used = _field(reader, f"{arch}.expert_used_count")  # a number, or one per block
        n_expert_used = int(max(used) if isinstance(used, list) else (used or 0))
        n_ff_expert = int(_field(reader, f"{arch}.expert_feed_forward_length") or 0)
        shared_ff = int(_field(reader, f"{arch}.expert_shared_feed_forward_length") or 0)
        shared_count = int(_field(reader, f"{arch}.expert_shared_count") or (1 if shared_ff else 0))
        return cls(n_expert, n_expert_used, n_ff_expert, shared_ff, shared_count)

    def ff_width(self, n_ff: int) -> int:
        """ModelInfo.moe_ff_width: the feed-forward rows one token goes through in a block."""
        if not self.n_expert:
            return 0
        return self.n_expert_used * (self.n_ff_expert or n_ff) + self.shared_count * self.shared_ff


def _inspect(path: Path) -> ModelInfo:
    reader = _open(path)
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(f"{path}: GGUF metadata lacks general.architecture")
    try:
        n_layers = _required_int(reader, path, f"{arch}.block_count")
        n_embd = _required_int(reader, path, f"{arch}.embedding_length")
        n_head, n_head_kv, head_dim_k, head_dim_v = _attention_heads(reader, path, arch, n_layers, n_embd)
        n_vocab = _vocab_size(reader, arch)
        n_ctx_train = _required_int(reader, path, f"{arch}.context_length")
        n_ff_value = _field(reader, f"{arch}.feed_forward_length")
        chat_template = _field(reader, "tokenizer.chat_template")
        n_swa, swa_layers = _sliding_window(reader, arch, n_layers)
        experts = _Experts.read(reader, arch)
    except _READ_ERRORS as error:
        raise ModelFileError(f"{path}: unexpected GGUF metadata ({error})") from None
    n_ff = int(max(n_ff_value) if isinstance(n_ff_value, list) else (n_ff_value or 4 * n_embd))
    table = _tensor_bytes(reader.tensors, n_layers)
    return ModelInfo(
        path=str(path),
        architecture=arch,
        n_layers=n_layers,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_ctx_train=n_ctx_train,
        n_vocab=n_vocab,
        n_ff=n_ff,
        file_bytes=path.stat().st_size,
        layer_bytes=tuple(table.layer_bytes),
        non_layer_bytes=table.non_layer_bytes,
        input_bytes=table.input_bytes,
        output_layer_bytes=table.output_layer_bytes,
        tied_embeddings=table.tied_embeddings,
        chat_template=chat_template if isinstance(chat_template, str) else "",
        n_swa=n_swa,
        swa_layers=swa_layers,
        n_expert=experts.n_expert,
        n_expert_used=experts.n_expert_used,
        expert_layer_bytes=table.expert_layer_bytes,
        expert_tensor_max_bytes=table.expert_tensor_max,
        expert_tensors=table.expert_tensors,
        moe_ff_width=experts.ff_width(n_ff),
    )
