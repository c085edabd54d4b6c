"""The `llama-server` command line for a worker profile: every number the planner chose, passed explicitly.

The planner stays authoritative: `--fit off` (llama.cpp's own auto-fit would otherwise move layers or shrink
the context behind the plan's back), explicit `-ngl`, `-c`, `-np`, cache types, flash attention and threads,
and for a Mixture-of-Experts model's expert split `--n-cpu-moe N` (the routed experts of blocks 0..N-1 stay
in RAM, every other tensor goes where `-ngl` puts it) and `-ot` for single expert tensors of block N.
`-c` is the total over all slots; without `--kv-unified` each slot gets `-c / -np`, which is exactly the
planner's per-sequence context, and the router never admits a request that would not fit its slot.
"""

from __future__ import annotations

from pathlib import Path

from tray_app.engine.cpu_quirks import amx_in_a_virtual_machine
from tray_app.engine.profile import WorkerProfile
from tray_app.engine.tools import is_template_file

# The logical batch (`-b`, llama-server's own default, passed so the router can count on it): the most prompt
# tokens one step reads. A prompt no longer than this is read in one step (see registry.upstream_stream).
PROMPT_BATCH = 2048
ALL_LAYERS = 999  # llama-server takes a number (or auto/all); more than any model has means all of them


def llama_server_argv(binary: Path, profile: WorkerProfile, port: int) -> list[str]:
    layers = rpc_offload(profile) if profile.rpc else profile.n_gpu_layers
    argv = [
        str(binary),
        "--model", str(profile.model_path),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--ctx-size", str(profile.n_ctx),
        "--parallel", str(max(profile.n_parallel, 1)),
        "--n-gpu-layers", str(ALL_LAYERS if layers < 0 else layers),
        "--threads", str(profile.n_threads),
        "--threads-batch", str(profile.n_threads),
        # One HTTP thread per slot, plus the health probe, the router's spare connection and a control
        # call: an idle keep-alive connection holds a thread, and a request finding none waits unseen.
        "--threads-http", str(max(profile.n_parallel, 1) + 3),
        "--batch-size", str(PROMPT_BATCH),
        "--ubatch-size", str(profile.n_ubatch),
        "--cache-type-k", profile.cache_type_k,
        "--cache-type-v", profile.cache_type_v,
        "--flash-attn", "on" if profile.flash_attn else "off",
        "--fit", "off",
        "--no-webui",
        "--metrics",
        "--jinja",
    ]  # fmt: skip
    if profile.model_name and "," not in profile.model_name:  # llama-server splits --alias at commas
        # Else llama-server names the model by its file path in every answer, which a streamed answer
        # passes on to the client as it came.
        argv += ["--alias", profile.model_name]
    if profile.n_gpu_layers == 0:
        # No layers on a GPU means no GPU at all: a GPU build would otherwise still send large prompt
        # batches to the card (op offload) and hold a context there, memory the plan never gave it.
        argv += ["--device", "none"]
    argv += [*expert_split_args(profile.n_cpu_moe, profile.cpu_expert_tensors), *rpc_args(profile)]
    if profile.cache_ram_mib is not None:
        # The prompt cache the CPU mirror fills, sized by the planner out of the RAM plan's free part.
        argv += ["--cache-ram", str(profile.cache_ram_mib)]
    if profile.embeddings:
        argv += ["--embeddings", "--pooling", profile.pooling]
    if is_template_file(profile.chat_format):
        argv += ["--chat-template-file", profile.chat_format]
    elif profile.chat_format:
        argv += ["--chat-template", profile.chat_format]
    if profile.simulated_vram_bytes is not None:
        # On a simulated device the weights must be a real allocation under the worker's memory limit, as
        # they are in VRAM, not pages of the model file that the kernel maps in and out.
        argv += ["--load-mode", "none"]
    if amx_in_a_virtual_machine():
        argv.append("--no-repack")
    return argv


def rpc_offload(profile: WorkerProfile) -> int:
    """`-ngl` with other machines' devices: their layers, and the local GPU's where the build has one (a
    simulated device is a CPU build: its layers stay in this process, the boxes take the last ones)."""
    remote = sum(profile.rpc_layers)
    return remote if profile.simulated_vram_bytes is not None else remote + profile.n_gpu_layers


def rpc_args(profile: WorkerProfile) -> list[str]:
    """`--rpc` and, with a local GPU device, `--tensor-split` in llama.cpp's device order: the RPC servers
    first, then the local GPU (src/llama.cpp), each given its count of the offloaded layers."""
    if not profile.rpc:
        return []
    argv = ["--rpc", ",".join(profile.rpc)]
    split = list(profile.rpc_layers)
    if profile.simulated_vram_bytes is None:
        split.append(profile.n_gpu_layers)
    return [*argv, "--tensor-split", ",".join(map(str, split))] if len(split) > 1 else argv


def expert_split_args(n_cpu_moe: int, partial: tuple[str, ...] = ()) -> list[str]:
    """A GPU worker's expert split (its plan's Plan.n_cpu_moe and cpu_expert_tensors): nothing without one,
    so a build that lacks the flags still runs every other model. `--override-tensor` takes regexes searched
    in each tensor's name ("blk\\.3\\.ffn_down_exps" matches block 3's weight and bias, not block 13's)
    and adds them to the same list `--n-cpu-moe` fills (common/arg.cpp)."""
    argv = ["--n-cpu-moe", str(n_cpu_moe)] if n_cpu_moe > 0 else []
    if partial:
        argv += ["--override-tensor", ",".join(rf"blk\.{n_cpu_moe}\.{stem}=CPU" for stem in partial)]
    return argv


# Set for a worker with no layers on a GPU, so a GPU build creates no device context (hundreds of MiB of
# VRAM each) for a process that must not use the card.
HIDE_GPUS = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": ""}


def worker_env(profile: WorkerProfile) -> dict[str, str]:
    """What a worker's environment adds (its API key comes from the supervisor)."""
    env = {"MALLOC_ARENA_MAX": "2"}  # glibc's 64 MiB arena per thread would eat a memory limit for nothing
    if profile.n_gpu_layers == 0:
        env.update(HIDE_GPUS)
    return env
