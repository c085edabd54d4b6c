"""How the service's previous run ended, read at the next start from real files (host.crash_record): the
marker a clean stop removes, faulthandler's crash log, and what a restarting parent saw."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tray_app.console.status_text import _restart_lines
from tray_app.host.crash_record import (
    CRASH_LOG,
    MARKER_FILE,
    STACK_LINES_LOGGED,
    begin_run,
    fatal_signal,
    last_crash,
    previous_crash,
)


def test_a_clean_stop_leaves_nothing_to_report(tmp_path: Path) -> None:
    first = begin_run(tmp_path / "data", tmp_path / "logs", env={})
    assert first.previous is None and (tmp_path / "data" / MARKER_FILE).exists()
    first.end()
    assert begin_run(tmp_path / "data", tmp_path / "logs", env={}).previous is None


def test_a_run_that_left_its_marker_crashed_and_a_parent_names_the_signal(tmp_path: Path) -> None:
    first = begin_run(tmp_path / "data", tmp_path / "logs", env={})
    second = begin_run(
        tmp_path / "data",
        tmp_path / "logs",
        env={"FAILSOFT_PREVIOUS_EXIT": "-9", "FAILSOFT_RESTARTED_BY": "tray"},
    )
    note = second.previous
    assert note is not None
    assert (note["pid"], note["signal"], note["exit_code"], note["restarted_by"]) == (
        first.pid,
        9,
        None,
        "tray",
    )
    assert note["stack_log"] is None  # a SIGKILL leaves no stack
    assert second.view()["restarted_after_crash"] == note


def test_a_native_crash_leaves_its_stack_and_signal_in_the_crash_log(tmp_path: Path) -> None:
    """A real child process: faulthandler on as `failsoft serve` turns it on, then a segmentation fault."""
    data, logs = tmp_path / "data", tmp_path / "logs"
    script = (
        "import faulthandler, sys; from pathlib import Path\n"
        "from tray_app.host.crash_record import begin_run, enable_crash_stacks\n"
        "enable_crash_stacks(Path(sys.argv[2])); begin_run(Path(sys.argv[1]), Path(sys.argv[2]), env={})\n"
        "faulthandler._sigsegv()\n"
    )
    crashed = subprocess.run([sys.executable, "-c", script, str(data), str(logs)], capture_output=True)
    assert crashed.returncode == -11
    left = json.loads((data / MARKER_FILE).read_text())
    note = previous_crash(data / MARKER_FILE, logs / CRASH_LOG, env={"INVOCATION_ID": "x"})
    assert note is not None and note["pid"] == left["pid"]
    assert (note["signal"], note["restarted_by"]) == (11, "systemd")
    stack = Path(str(note["stack_log"])).read_text()
    assert "Fatal Python error: Segmentation fault" in stack and 'File "<string>", line 4' in stack
    lines = _restart_lines({"service": {"pid": 1, "started_at": 0.0, "restarted_after_crash": note}})  # type: ignore[typeddict-item]
    assert (
        lines and lines[0].startswith("The service restarted after a crash at ") and "(signal 11)" in lines[0]
    )


def test_the_signal_is_read_from_the_last_fatal_error() -> None:
    text = "Fatal Python error: Aborted\n...\nFatal Python error: Segmentation fault\n\nThread 0x1:\n"
    assert fatal_signal(text) == 11
    assert fatal_signal("Fatal Python error: Bus error\n") == 7
    assert fatal_signal("no crash here") is None


def test_a_long_report_is_logged_from_its_signal_line_on() -> None:
    # Many threads: the head names the signal and the crashing thread; the tail is counted, not shown.
    earlier = ["Fatal Python error: Aborted", "  File old"]
    report = ["Fatal Python error: Segmentation fault", ""] + [f'  File "x.py", line {n}' for n in range(200)]
    shown = last_crash(earlier + report)
    assert shown[0] == "Fatal Python error: Segmentation fault"
    assert len(shown) == STACK_LINES_LOGGED + 1
    assert shown[-1] == f"... {len(report) - STACK_LINES_LOGGED} more lines in the file"
    assert last_crash(["a", "b"]) == ["a", "b"]  # no header: the tail, as it is
