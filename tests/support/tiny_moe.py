"""A tiny Mixture-of-Experts GGUF with random weights, written with the `gguf` package: a real file that
llama.cpp loads (its answers are nonsense), small enough to build in a test's tmp dir (about 3.5 MB).

The architecture is `qwen3moe`, written to what llama.cpp's loader asks of it (src/models/qwen3moe.cpp:
q/k/v/output attention with q and k norms, a router `ffn_gate_inp` and the routed experts `ffn_{gate,up,
down}_exps` in every block; `expert_count`, `expert_used_count` and the RMS norm epsilon) and a SentencePiece
vocabulary of the three special tokens and the 256 byte tokens it requires, plus a few words.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

ARCH = "qwen3moe"
# The word pieces after the byte tokens; any text the byte fallback covers.
WORDS = ("▁the", "▁a", "▁hello", "▁world", "▁and", "▁of", "▁to", "▁is", "▁it", "▁in")
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyMoe:
    """The shape of the tiny model; every size in the file follows from it."""

    n_layers: int = 8
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 128
    n_ctx_train: int = 4096

    @property
    def n_vocab(self) -> int:
        return 3 + 256 + len(WORDS)

    @property
    def expert_tensor_bytes(self) -> int:
        """One of a block's three expert tensors (f16)."""
        return self.n_embd * self.n_ff_exp * self.n_expert * 2

    @property
    def expert_layer_bytes(self) -> int:
        return 3 * self.expert_tensor_bytes

    @property
    def dense_layer_bytes(self) -> int:
        """Attention (f16), router and norms (f32): everything of a block but its experts."""
        q_out = self.n_head * self.head_dim
        kv_out = self.n_head_kv * self.head_dim
        attention = (self.n_embd * q_out * 2 + self.n_embd * kv_out * 2) * 2
        norms = (2 * self.n_embd + 2 * self.head_dim) * 4
        return attention + self.n_embd * self.n_expert * 4 + norms


def _vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{byte:02X}>" for byte in range(256)] + list(WORDS)
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(WORDS)
    scores = [0.0] * 259 + [-float(rank) for rank in range(len(WORDS))]
    return tokens, scores, [int(kind) for kind in types]


def _metadata(writer: gguf.GGUFWriter, shape: TinyMoe) -> None:
    writer.add_name("tiny-moe")
    writer.add_block_count(shape.n_layers)
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_feed_forward_length(shape.n_ff_exp * shape.n_expert_used)
    writer.add_expert_feed_forward_length(shape.n_ff_exp)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_expert_count(shape.n_expert)
    writer.add_expert_used_count(shape.n_expert_used)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, scores, types = _vocab()
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template(CHATML)


def _tensors(shape: TinyMoe, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """numpy shapes are ggml's reversed: ggml's {n_in, n_out, n_expert} is (n_expert, n_out, n_in) here."""

    def weight(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims) * 0.02).astype(np.float16)

    def norm(width: int) -> np.ndarray:
        return np.ones(width, dtype=np.float32)

    embd, q_out, kv_out = shape.n_embd, shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    tensors = {
        "token_embd.weight": weight(shape.n_vocab, embd),
        "output_norm.weight": norm(embd),
        "output.weight": weight(shape.n_vocab, embd),
    }
    for layer in range(shape.n_layers):
        block = f"blk.{layer}."
        tensors.update(
            {
                block + "attn_norm.weight": norm(embd),
                block + "attn_q.weight": weight(q_out, embd),
                block + "attn_k.weight": weight(kv_out, embd),
                block + "attn_v.weight": weight(kv_out, embd),
                block + "attn_output.weight": weight(embd, q_out),
                block + "attn_q_norm.weight": norm(shape.head_dim),
                block + "attn_k_norm.weight": norm(shape.head_dim),
                block + "ffn_norm.weight": norm(embd),
                block + "ffn_gate_inp.weight": (rng.standard_normal((shape.n_expert, embd)) * 0.02).astype(
                    np.float32
                ),
                block + "ffn_gate_exps.weight": weight(shape.n_expert, shape.n_ff_exp, embd),
                block + "ffn_up_exps.weight": weight(shape.n_expert, shape.n_ff_exp, embd),
                block + "ffn_down_exps.weight": weight(shape.n_expert, embd, shape.n_ff_exp),
            }
        )
    return tensors


def write_tiny_moe(path: Path, shape: TinyMoe | None = None, seed: int = 0) -> Path:
    """Write the tiny MoE model to `path` (the same bytes for the same shape and seed) and return it."""
    shape = shape or TinyMoe()
    writer = gguf.GGUFWriter(path, ARCH)
    _metadata(writer, shape)
    for name, data in _tensors(shape, np.random.default_rng(seed)).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
