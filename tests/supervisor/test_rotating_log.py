"""The worker log: bytes appended as they come, rotated by size, the supervisor's own lines stamped."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tray_app.supervisor.process import TAIL_BYTES, TAIL_LINES, RotatingLog, WorkerProcess, notable_lines


def test_rotates_by_size_and_keeps_the_newest(tmp_path: Path) -> None:
    path = tmp_path / "gpu-worker.log"
    log = RotatingLog(path, max_bytes=100, backups=2)
    for number in range(7):
        log.write(f"line {number} ".encode() + b"x" * 30 + b"\n")  # 38 bytes each: two fit in 100
    log.line("worker 42 ended with status -6")
    log.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gpu-worker.log",
        "gpu-worker.log.1",
        "gpu-worker.log.2",
    ]
    newest = path.read_text()
    assert "line 6" in newest and newest.rstrip().endswith("worker 42 ended with status -6")
    assert newest.splitlines()[-1].startswith("--- ")
    assert "line 4" in (tmp_path / "gpu-worker.log.1").read_text()
    assert "line 0" not in "".join(p.read_text() for p in tmp_path.iterdir())  # older than the backups


def test_appends_to_what_an_earlier_run_left(tmp_path: Path) -> None:
    path = tmp_path / "cpu-worker.log"
    path.write_bytes(b"earlier run\n")
    log = RotatingLog(path, max_bytes=1000)
    log.write(b"this run\n")
    log.close()
    log.write(b"after close: dropped\n")
    assert path.read_text() == "earlier run\nthis run\n"


def test_without_request_logging_only_warnings_errors_and_unprefixed_lines_stay() -> None:
    block = (
        b"0.02.017.644 I slot get_availabl: id  3 | task -1 | selected slot by LRU\n"
        b"\trepeat_last_n = 64, repeat_penalty = 1.000\n"
        b"0.02.508.320 W srv  update_slots: failed to find free space in the KV cache\n"
        b"0.02.508.321 E srv  update_slots: Compute error. off = 0, n_batch = 1, ret = -3\n"
        b"CUDA error: out of memory\n"
        b"  current device: 0, in function ggml_cuda_pool_malloc\n"
    )
    assert notable_lines(block) == (
        b"0.02.508.320 W srv  update_slots: failed to find free space in the KV cache\n"
        b"0.02.508.321 E srv  update_slots: Compute error. off = 0, n_batch = 1, ret = -3\n"
        b"CUDA error: out of memory\n"
    )

    info_only = b"0.02.017.644 I slot get_availabl: id  3 | task -1 | selected slot by LRU\n" * 3
    assert notable_lines(info_only) == b""


async def test_a_workers_tail_is_its_last_lines_however_much_it_printed(tmp_path: Path) -> None:
    # Many small writes (as llama.cpp prints, a line at a time) adding up to several times what is kept.
    lines = TAIL_BYTES // 20 * 4
    script = (
        "import sys\n"
        f"for i in range({lines}):\n"
        "    sys.stdout.write(f'line {i:07d} of output\\n'); sys.stdout.flush()"
    )
    process = WorkerProcess.spawn([sys.executable, "-c", script], tmp_path / "worker.log")
    assert await asyncio.wait_for(asyncio.shield(process.exited), 30) == 0
    tail = process.tail()
    assert len(tail) == TAIL_LINES
    assert tail[-1] == f"line {lines - 1:07d} of output"
    assert tail[0] == f"line {lines - TAIL_LINES:07d} of output"


async def test_a_loaded_workers_last_words_are_read_as_it_exits(tmp_path: Path) -> None:
    # After "model loaded" the output is read in batches; the exit still brings the last line at once.
    script = (
        "import sys, time\n"
        "print('main: model loaded', flush=True)\n"
        "for i in range(50):\n"
        "    print(f'0.00.000.{i:03d} I request line {i}', flush=True); time.sleep(0.002)\n"
        "print('GGML_ASSERT failed: last words', flush=True)\n"
        "sys.exit(3)"
    )
    process = WorkerProcess.spawn([sys.executable, "-c", script], tmp_path / "worker.log", log_requests=False)
    assert await asyncio.wait_for(asyncio.shield(process.exited), 30) == 3
    assert process.tail()[-1] == "GGML_ASSERT failed: last words"
    assert process.loaded
    logged = (tmp_path / "worker.log").read_text()
    assert "GGML_ASSERT failed: last words\n" in logged and "request line 49" not in logged
