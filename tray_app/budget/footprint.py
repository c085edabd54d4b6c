"""What a llama.cpp worker takes on a device, in bytes: weights, KV cache, compute and logits buffers, the
reserve, the context as llama.cpp pads it, and the CPU worker's prompt cache. Pure functions.

Layer counting follows llama.cpp: a model with N repeating blocks has N + 1 offloadable layers, the last being
the output layer (output norm and output matrix), so `n_gpu_layers == N + 1` means everything on the GPU. A
smaller count offloads the output layer first, then the last n_gpu_layers - 1 blocks (offloaded_blocks).
"""

from __future__ import annotations

from tray_app.budget.experts import (
    NO_SPLIT,
    ExpertSplit,
    experts_kept_on_cpu,
    offloaded_blocks,
    output_offloaded,
)
from tray_app.budget.model_info import ModelInfo
from tray_app.budget.plan import ComputeSettings, Plan, PlanError, PlanRequest

# Bytes per block and elements per block of each KV cache type (ggml's type sizes).
CACHE_TYPE_BLOCKS: dict[str, tuple[int, int]] = {"f16": (2, 1), "q8_0": (34, 32), "q4_0": (18, 32)}
# llama.cpp rounds the context (and each sequence's share of it) up to a multiple of this.
CTX_PAD = 256
FLOAT_BYTES = 4
F16_BYTES = 2
# ggml's allocator packs the graph's tensors with some fragmentation: measured 0-4 % above the peak tensors.
COMPUTE_MARGIN = 1.05


def cache_row_bytes(cache_type: str, n_elements: int) -> int:
    """Bytes of one cache row of `n_elements` values (ggml_row_size)."""
    try:
        block_bytes, block_elements = CACHE_TYPE_BLOCKS[cache_type]
    except KeyError:
        raise PlanError(
            f"unknown cache type {cache_type!r}; use one of {', '.join(CACHE_TYPE_BLOCKS)}"
        ) from None
    return -(-n_elements // block_elements) * block_bytes


def padded_context(n_ctx: int, n_parallel: int) -> tuple[int, int]:
    """(n_ctx, n_ctx_per_seq) as llama.cpp sets them: the total padded to 256, each sequence's share padded to
    256, the total then made the exact multiple (non-unified cache: one stream per sequence)."""
    total = -(-max(n_ctx, 1) // CTX_PAD) * CTX_PAD
    per_seq = -(-(total // n_parallel) // CTX_PAD) * CTX_PAD
    return per_seq * n_parallel, per_seq


def kv_cache_bytes(
    model: ModelInfo,
    n_ctx: int,
    request: PlanRequest,
    layers: range | None = None,
    n_parallel: int | None = None,
) -> int:
    """Σ over layers of cells × (row of K + row of V): exactly what llama.cpp allocates for these layers.

    A layer has n_ctx cells, except a sliding-window layer (llama_kv_cache_iswa): each of the `n_parallel`
    sequences (default: the request's) keeps its window plus one ubatch, padded to 256, at most its own
    context. That is llama-server's cache as the workers run it (no --swa-full, no --kv-unified).
    """
    layers = layers if layers is not None else range(model.n_layers)
    n_parallel = n_parallel or request.n_parallel
    swa_cells = n_parallel * swa_window_cells(model, n_ctx // n_parallel, request.n_ubatch)
    # Without flash attention V is stored transposed, every layer padded to the widest V (llama.cpp does so).
    widest_v = max(model.n_head_kv, default=0) * model.head_dim_v
    total = 0
    for layer in layers:
        n_head_kv = model.n_head_kv[layer]
        if n_head_kv == 0:
            continue  # a layer without attention has no cache
        k_row = cache_row_bytes(request.cache_type_k, n_head_kv * model.head_dim_k)
        v_width = n_head_kv * model.head_dim_v if request.flash_attn else widest_v
        cells = swa_cells if model.swa_layers and model.swa_layers[layer] else n_ctx
        total += cells * (k_row + cache_row_bytes(request.cache_type_v, v_width))
    return total


def swa_window_cells(model: ModelInfo, n_ctx_seq: int, n_ubatch: int) -> int:
    """The cells a sliding-window layer keeps per sequence: its window plus one ubatch, padded to 256, at
    most the sequence's context (0 for a model without such layers)."""
    if not model.swa_layers:
        return 0
    return -(-min(n_ctx_seq, model.n_swa + n_ubatch) // CTX_PAD) * CTX_PAD


def output_buffer_bytes(model: ModelInfo, n_parallel: int) -> int:
    """The logits buffer llama.cpp reserves at start: one row of n_vocab floats per sequence."""
    return model.n_vocab * n_parallel * FLOAT_BYTES


def estimate_compute_bytes(model: ModelInfo, settings: ComputeSettings) -> int:
    """An estimate of llama.cpp's compute buffer (the graph's peak workspace), from the worst case it
    reserves: one ubatch of prompt tokens attending to a whole sequence's cache.

    Two peaks compete. The logits at the end of the graph: a chat worker's llama-server reserves one output
    row per slot (`n_outputs_max`, see server_output_limits in tools/server), an embeddings worker one per
    token of the batch. And the attention: the residual, feed-forward (gate, up and their product) and
    attention-output rows of every ubatch token, with the mask over the sequence's cache (f16 with flash
    attention, the scores staying in tiles; without it the K·Q scores, one n_ctx_seq × ubatch float matrix
    per head, and a float mask). A model with sliding-window layers has a second mask, over its window.
    Checked against what llama-server reports at load (SmolLM2 and Gemma 3 at 1 and 4 slots, 2k to 32k
    tokens): never under it; the allocator's fragmentation is covered by a small margin.
    """
    n_tokens = min(settings.n_ctx, settings.n_ubatch)
    n_ctx_seq = settings.n_ctx // settings.n_parallel
    n_outputs = n_tokens if settings.embeddings else min(settings.n_parallel, n_tokens)
    logits = (n_outputs * model.n_vocab + n_tokens * 2 * model.n_embd) * FLOAT_BYTES
    rows = n_tokens * (2 * model.n_embd + 3 * model.n_ff + 2 * model.n_head * model.head_dim_v) * FLOAT_BYTES
    if model.is_moe:
        # The routed experts' gate, up and product rows beside the residual and its norm, nothing else: what
        # llama.cpp's Vulkan build printed for the MoE test model, with experts on the GPU or in RAM alike.
        rows = n_tokens * (2 * model.n_embd + 3 * model.moe_ff_width) * FLOAT_BYTES
    if settings.flash_attn:
        window = swa_window_cells(model, n_ctx_seq, settings.n_ubatch)
        attention = rows + (n_ctx_seq + window) * n_tokens * F16_BYTES
    else:
        attention = rows + n_ctx_seq * n_tokens * (model.n_head + 1) * FLOAT_BYTES
    return int(max(logits, attention) * COMPUTE_MARGIN)


def split_copy_bytes(model: ModelInfo, settings: ComputeSettings) -> int:
    """GPU compute memory a layer split of an MoE model adds to the whole model's: the scheduler keeps the
    residual rows crossing between the devices, and those of a prompt batch it runs on the GPU for blocks
    left in RAM (op offload). Measured +1.07 MiB on the MoE test model at 512-token ubatches, whatever the
    split; a dense model's estimate covers it with its attention rows. An expert split adds nothing: the
    buffer was the same with and without experts in RAM."""
    if not model.is_moe:
        return 0
    n_tokens = min(settings.n_ctx, settings.n_ubatch)
    return int(2 * n_tokens * model.n_embd * FLOAT_BYTES * COMPUTE_MARGIN)


def reserve_bytes(total_bytes: int, percent: float, minimum: int) -> int:
    """The larger of a share of the device and an absolute floor."""
    return max(int(total_bytes * percent / 100), minimum)


def gpu_weights_bytes(model: ModelInfo, n_gpu_layers: int, experts: ExpertSplit = NO_SPLIT) -> int:
    """Weights llama.cpp puts on the GPU for `n_gpu_layers`: the output layer, then the last blocks; less
    the experts an expert split keeps in RAM."""
    weights = sum(model.layer_bytes[layer] for layer in offloaded_blocks(model, n_gpu_layers))
    if output_offloaded(n_gpu_layers):
        weights += model.output_layer_bytes
    return weights - experts_kept_on_cpu(model, n_gpu_layers, experts)


def host_weights_bytes(model: ModelInfo, n_gpu_layers: int, experts: ExpertSplit = NO_SPLIT) -> int:
    """Weights that stay in system RAM: the blocks not offloaded and the tensors outside the blocks, except
    the output layer's own tensors once it is offloaded (a tied embedding stays: its copy went to the GPU),
    and the experts an expert split keeps there."""
    host = sum(model.layer_bytes[: offloaded_blocks(model, n_gpu_layers).start]) + model.non_layer_bytes
    if output_offloaded(n_gpu_layers):
        host -= model.output_layer_bytes - (model.input_bytes if model.tied_embeddings else 0)
    return host + experts_kept_on_cpu(model, n_gpu_layers, experts)


# Prompts of a whole slot's context the CPU worker's prompt cache holds: the mirror's conversations.
PROMPT_CACHE_PROMPTS = 8
MIB = 1024**2


def prompt_cache_bytes(plan: Plan) -> int:
    """The CPU worker's prompt cache: room for PROMPT_CACHE_PROMPTS prompts as long as a slot's context
    (each token costs what it costs in the KV cache), at most half of what the plan leaves free; whole MiB,
    as llama-server takes it."""
    if plan.n_ctx <= 0:
        return 0
    per_token = (plan.kv_bytes + plan.host_kv_bytes) / plan.n_ctx
    wanted = int(per_token * plan.n_ctx_per_seq * PROMPT_CACHE_PROMPTS)
    return min(wanted, plan.free_bytes // 2) // MIB * MIB
