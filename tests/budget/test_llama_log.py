"""Parsing the buffer sizes llama.cpp prints: real captured text, several backends, no double counting."""

from __future__ import annotations

from pathlib import Path

from tray_app.engine.llama_log import BufferSizes, as_printed, parse_buffer_sizes

MIB = 1024**2
DATA = Path(__file__).parent / "data"


def mib(value: float) -> int:
    return round(value * MIB)


def test_real_cpu_load_log() -> None:
    # Captured from llama-cpp-python loading the bundled model at n_ctx 2048 on a CPU with AMX: the weights
    # are mapped from the file and a repacked copy is kept in the AMX buffer.
    sizes = parse_buffer_sizes((DATA / "llama_load_smollm2_cpu_amx.log").read_text())
    assert sizes.kv_bytes == 45 * MIB  # the KV buffer line; the "size = 45.00 MiB" summary is not added
    assert sizes.model_bytes == mib(95.34) + mib(92.10)
    assert sizes.model_buffers == (("AMX", mib(95.34)), ("CPU_Mapped", mib(92.10)))
    assert sizes.model_buffer("CPU_Mapped") == mib(92.10)
    # the destructor's "compute buffer size is ..." line is not a second compute buffer
    assert sizes.compute_bytes == mib(99.38)
    assert sizes.output_bytes == mib(0.19)
    assert sizes.total_bytes == sizes.model_bytes + 45 * MIB + mib(99.38) + mib(0.19)
    assert sizes.to_dict() == {
        "model_bytes": sizes.model_bytes,
        "kv_bytes": 45 * MIB,
        "compute_bytes": mib(99.38),
        "output_bytes": mib(0.19),
        "model_buffers": {"AMX": mib(95.34), "CPU_Mapped": mib(92.10)},
        "kv_buffers": {"CPU": 45 * MIB},
        "compute_buffers": {"CPU": mib(99.38)},
    }


# The shape a CUDA build prints for a partly offloaded model (same format strings as the CPU build).
CUDA_SPLIT = """
load_tensors: offloaded 20/31 layers to GPU
load_tensors:        CUDA0 model buffer size =  2048.50 MiB
load_tensors:   CPU_Mapped model buffer size =  1024.25 MiB
llama_context:  CUDA_Host  output buffer size =     0.49 MiB
llama_kv_cache:      CUDA0 KV buffer size =   640.00 MiB
llama_kv_cache:        CPU KV buffer size =   384.00 MiB
llama_kv_cache: size = 1024.00 MiB (  8192 cells,  32 layers,  1/1 seqs), K (f16):  512.00 MiB, V (f16): ...
sched_reserve:      CUDA0 compute buffer size =   560.00 MiB
sched_reserve:  CUDA_Host compute buffer size =    24.01 MiB
"""


def test_several_backends_add_up() -> None:
    sizes = parse_buffer_sizes(CUDA_SPLIT)
    assert sizes.model_bytes == mib(2048.50) + mib(1024.25)
    assert sizes.kv_bytes == 1024 * MIB  # 640 + 384; the summary line repeats them and is not counted
    assert sizes.compute_bytes == 560 * MIB + mib(24.01)
    assert sizes.output_bytes == mib(0.49)


def test_kv_summary_is_used_when_no_buffer_line_was_printed() -> None:
    text = "llama_kv_cache: size =   90.00 MiB (  4096 cells,  30 layers,  1/1 seqs), K (f16):   45.00 MiB\n"
    assert parse_buffer_sizes(text).kv_bytes == 90 * MIB


def test_a_re_reserved_compute_buffer_replaces_the_first() -> None:
    text = (
        "sched_reserve:        CPU compute buffer size =    99.38 MiB\n"
        "sched_reserve:        CPU compute buffer size =   101.00 MiB\n"
    )
    assert parse_buffer_sizes(text).compute_bytes == 101 * MIB


def test_text_without_sizes_gives_zeros() -> None:
    assert parse_buffer_sizes("llama_context: n_ctx = 2048\nsomething else\n") == BufferSizes()


def test_as_printed_matches_llama_cpp_precision() -> None:
    assert as_printed(45 * MIB) == "45.00"
    assert as_printed(53084160) == "50.62"  # a q4_0 cache is not a whole number of MiB


def test_a_device_on_another_machine_is_named_with_its_address_and_kept_apart() -> None:
    log = """\
load_tensors:          CPU model buffer size =    83.65 MiB
load_tensors: RPC0[192.168.1.30:50052] model buffer size =    37.14 MiB
llama_kv_cache: RPC0[192.168.1.30:50052] KV buffer size =     6.00 MiB
sched_reserve: RPC0[192.168.1.30:50052] compute buffer size =    11.76 MiB
sched_reserve:        CPU compute buffer size =    14.01 MiB
"""
    sizes = parse_buffer_sizes(log)
    assert sizes.model_buffer("RPC0[192.168.1.30:50052]") == round(37.14 * 1024**2)
    assert sizes.kv_bytes == 6 * 1024**2
    # This machine's compute buffers alone: what a simulated GPU on it holds.
    assert sizes.local_compute_bytes() == round(14.01 * 1024**2)
    assert sizes.compute_bytes == round(11.76 * 1024**2) + round(14.01 * 1024**2)
