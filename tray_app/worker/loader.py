"""Load the model behind llama-cpp-python's own server app, off the event loop, so /health says "loading".

Order, as a user's llama.cpp would see it: optional memory limit, model load with the log captured, buffer
sizes parsed and recorded for calibration, then the checks that make a simulated GPU (or an injected fault)
fail the way a real one does, then chat format and fault hooks, then ready.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from collections.abc import Callable

import llama_cpp
import llama_cpp._logger as llama_logger
import llama_cpp.server.app as llama_server
from llama_cpp.server.settings import ModelSettings, ServerSettings

from tray_app import calibration
from tray_app.llama_log import BufferSizes, capture_llama_log
from tray_app.planner import ComputeSettings
from tray_app.worker import chat_formats, cpu_quirks, simulated
from tray_app.worker.args import WorkerArgs
from tray_app.worker.memory_limit import apply_address_space_limit
from tray_app.worker.state import WorkerState

log = logging.getLogger(__name__)

_GGML_TYPES = {
    "f16": llama_cpp.GGML_TYPE_F16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
}


def model_settings(args: WorkerArgs) -> ModelSettings:
    return ModelSettings(
        model=str(args.model),
        model_alias=args.model.name,
        n_gpu_layers=args.n_gpu_layers,
        n_ctx=args.n_ctx,
        n_ubatch=args.n_ubatch,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        flash_attn=args.flash_attn,
        type_k=_GGML_TYPES[args.cache_type_k],
        type_v=_GGML_TYPES[args.cache_type_v],
        chat_format=args.chat_format or None,
        # All-token logits are only for logprobs; they would cost n_ctx x vocab floats of RAM and a full
        # output projection for every prompt token.
        logits_all=False,
        verbose=True,  # llama.cpp's own log goes to stderr, i.e. the worker log file
    )


def server_settings(args: WorkerArgs) -> ServerSettings:
    # interrupt_requests=True would cut a running stream whenever another request arrives.
    return ServerSettings(host=args.host, port=args.port, interrupt_requests=False)


def _record_calibration(args: WorkerArgs, buffers: BufferSizes) -> None:
    if buffers.total_bytes == 0:
        log.warning("llama.cpp printed no buffer sizes: nothing to record for calibration")
        return
    if args.role == "cpu" and llama_cpp.llama_supports_gpu_offload():
        return  # with a GPU build the CPU worker's compute buffer is not the one the VRAM plan needs
    settings = ComputeSettings(
        n_ctx=args.n_ctx,
        n_parallel=args.n_parallel,
        cache_type_k=args.cache_type_k,
        cache_type_v=args.cache_type_v,
        flash_attn=args.flash_attn,
        n_ubatch=args.n_ubatch,
    )
    try:
        calibration.record_measurement(args.model, settings, buffers)
    except OSError as error:
        log.warning("could not record the measured buffers: %s", error)


def _fail_like_a_gpu(args: WorkerArgs, llama: llama_cpp.Llama, buffers: BufferSizes) -> None:
    """Raise the real load-time out-of-memory error when an injected fault or the simulated VRAM says so."""
    if args.fault_load_oom:
        size = buffers.kv_bytes or 1
        lines = simulated.alloc_failed_lines(
            size,
            "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache",
        )
        simulated.raise_out_of_memory(lines, "Failed to create llama_context")
    if args.simulated_vram_bytes is None:
        return
    n_layers = llama_cpp.llama_model_n_layer(llama.model) + 1  # repeating blocks + the output layer
    allocation = simulated.device_share(buffers, args.n_gpu_layers, n_layers)
    failure = simulated.failure_for(allocation, args.simulated_vram_bytes, args.model)
    if failure is not None:
        simulated.raise_out_of_memory(*failure)


def quiet_after_load(llama: llama_cpp.Llama) -> None:
    """Keep llama.cpp's errors in the log but drop its per-request timings: the load log (buffer sizes) is
    already parsed, and six lines for every request would make the supervisor's log pump compete with the
    router for the CPU."""
    llama.verbose = False
    llama_logger.set_verbose(False)  # llama.cpp's log callback: errors only from here on


def load_model(args: WorkerArgs, state: WorkerState, on_failure: Callable[[], None]) -> None:
    """Run in a thread: load, check, then mark the state ready; on any error print it, mark failed, and call
    `on_failure` (which ends the process, as llama-cpp-python's server ends when its model fails to load)."""
    started = time.monotonic()
    try:
        if args.simulated_vram_bytes is not None:
            state.memory_limit = apply_address_space_limit(args.simulated_vram_bytes)
        state.extra_buffers_disabled = cpu_quirks.apply()
        with capture_llama_log() as captured:
            app = llama_server.create_app(
                server_settings=server_settings(args), model_settings=[model_settings(args)]
            )
        proxy = llama_server._llama_proxy  # the loaded model; llama-cpp-python keeps it module-global
        if proxy is None:
            raise RuntimeError("llama-cpp-python created no model")
        llama = proxy()
        state.buffers = captured.buffer_sizes()
        _record_calibration(args, state.buffers)
        _fail_like_a_gpu(args, llama, state.buffers)
        if not args.chat_format and chat_formats.is_chatml(llama):
            state.chat_format = chat_formats.use_tools_with_chatml(llama)
        else:
            state.chat_format = llama.chat_format or ""
        if not args.log_requests:
            quiet_after_load(llama)
        if state.faults is not None:
            state.faults.attach(llama)
        state.load_seconds = time.monotonic() - started
        state.mark_ready(app)
    except BaseException as error:
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        state.mark_failed(f"{type(error).__name__}: {error}")
        on_failure()
