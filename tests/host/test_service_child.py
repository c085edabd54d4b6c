"""The tray's service child (host/service_child.py) on a tiny real child process: started again after a crash
with a growing pause and told how the run before ended, not started again after it said why it cannot start,
and stopped with its whole process group, SIGKILL when SIGTERM is ignored."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.waits import wait_until
from tray_app.host.service_child import (
    PREVIOUS_EXIT_ENV,
    RESTARTED_BY_ENV,
    Backoff,
    Change,
    ChildChange,
    ServiceChild,
    Start,
    Stop,
    exit_words,
    serve_argv,
)

# Each run: one JSON line (its pid, group, the two variables), a grandchild in its group, then "ready" (its
# pid in a file) and whatever argv[2] says: wait, exit with a status, or ignore SIGTERM and wait.
CHILD = r"""
import json, os, resource, signal, subprocess, sys, time
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
folder, mode = sys.argv[1], sys.argv[2]
if mode == "refuse":
    print("failsoft: /nowhere/model.gguf: model file not found", flush=True)
    sys.exit(2)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                               "signal.SIG_IGN); time.sleep(600)"])
run = {"pid": os.getpid(), "pgid": os.getpgid(0), "grandchild": grandchild.pid,
       "previous_exit": os.environ.get("FAILSOFT_PREVIOUS_EXIT"),
       "restarted_by": os.environ.get("FAILSOFT_RESTARTED_BY")}
with open(os.path.join(folder, "runs.jsonl"), "a") as runs:
    runs.write(json.dumps(run) + "\n")
print("serving", flush=True)
with open(os.path.join(folder, "ready.tmp"), "w") as ready:
    ready.write(str(os.getpid()))
os.replace(os.path.join(folder, "ready.tmp"), os.path.join(folder, "ready"))
if mode == "clean-exit":  # once the test says so
    while not os.path.exists(os.path.join(folder, "exit-now")):
        time.sleep(0.02)
    grandchild.kill()
    sys.exit(0)
time.sleep(600)
"""


class Recorder:
    def __init__(self) -> None:
        self.changes: list[ChildChange] = []
        self._lock = threading.Lock()

    def __call__(self, change: ChildChange) -> None:
        with self._lock:
            self.changes.append(change)

    def of(self, kind: Change) -> list[ChildChange]:
        with self._lock:
            return [change for change in self.changes if change.change is kind]

    def nth(self, kind: Change, index: int) -> ChildChange | None:
        changes = self.of(kind)
        return changes[index] if len(changes) > index else None


@pytest.fixture
def make_child(tmp_path: Path) -> Iterator[Any]:
    children: list[ServiceChild] = []
    script = tmp_path / "child.py"
    script.write_text(CHILD, encoding="utf-8")

    def make(
        mode: str, backoff: Backoff | None = None, stop_grace: float = 5.0
    ) -> tuple[ServiceChild, Recorder]:
        recorder = Recorder()
        ready_file = tmp_path / "ready"
        holder: list[ServiceChild] = []

        def ready() -> bool:
            try:
                return ready_file.read_text(encoding="utf-8") == str(holder[0].pid)
            except OSError:
                return False

        child = ServiceChild(
            [sys.executable, str(script), str(tmp_path), mode],
            tmp_path / "logs" / "service.log",
            ready,
            recorder,
            backoff=backoff or Backoff(first=0.1, cap=0.4),
            stop_grace=stop_grace,
        )
        holder.append(child)
        children.append(child)
        return child, recorder

    yield make
    for child in children:
        child.stop(grace=2)


def runs(folder: Path) -> list[dict[str, Any]]:
    path = folder / "runs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_pause_before_a_restart_doubles_up_to_its_cap_and_starts_again_after_a_long_run() -> None:
    backoff = Backoff()
    assert [backoff.after_exit(0.5) for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff.after_exit(61) == 1  # it ran a minute: a new crash is not part of the old streak
    assert backoff.after_exit(3) == 2


def test_a_crashed_child_is_started_again_and_told_how_the_run_before_ended(
    make_child: Any, tmp_path: Path
) -> None:
    child, recorder = make_child("serve")
    assert child.start() is Start.OK
    assert child.start() is Start.ALREADY_RUNNING
    for crash, sig in enumerate((signal.SIGSEGV, signal.SIGKILL, signal.SIGABRT)):
        ready = wait_until(partial(recorder.nth, Change.READY, crash), 30, f"run {crash + 1} to be ready")
        run = runs(tmp_path)[-1]
        assert ready.pid == run["pid"] == run["pgid"]  # the child leads a process group of its own
        os.kill(ready.pid, sig)
        crashed = wait_until(partial(recorder.nth, Change.CRASHED, crash), 30, f"crash {crash + 1}")
        assert (crashed.pid, crashed.returncode) == (ready.pid, -sig)
        # Its group went with it: nothing it started outlives it.
        wait_until(partial(gone, run["grandchild"]), 10, "the crashed child's grandchild to end")
    wait_until(lambda: len(recorder.of(Change.READY)) == 4, 30, "the fourth run")

    assert [change.restart_in for change in recorder.of(Change.CRASHED)] == [0.1, 0.2, 0.4]
    every = runs(tmp_path)
    assert [(run["previous_exit"], run["restarted_by"]) for run in every] == [
        (None, None),
        ("-11", "tray"),
        ("-9", "tray"),
        ("-6", "tray"),
    ]
    assert child.restarts == 3
    log = (tmp_path / "logs" / "service.log").read_text(encoding="utf-8")
    assert "serving" in log  # the child's own output goes to the log file
    assert "ended unasked: signal 11 (SIGSEGV)" in log and "starting after signal 9 (SIGKILL)" in log

    last = every[-1]
    assert child.stop() is Stop.OK
    assert recorder.of(Change.STOPPED)[-1].pid == last["pid"]
    # The group was killed; the grandchild's end reaches /proc a moment later on a busy machine.
    wait_until(lambda: gone(last["pid"]) and gone(last["grandchild"]), 10, "the last run and its grandchild")
    assert len(runs(tmp_path)) == 4  # asked to stop: not started again


def test_stop_kills_the_whole_group_when_sigterm_is_ignored(make_child: Any, tmp_path: Path) -> None:
    child, recorder = make_child("stubborn", stop_grace=0.5)
    assert child.start() is Start.OK
    wait_until(lambda: recorder.of(Change.READY), 30, "the child to be ready")
    run = runs(tmp_path)[-1]
    assert child.stop() is Stop.KILLED
    wait_until(lambda: gone(run["pid"]) and gone(run["grandchild"]), 10, "the child's group to end")
    assert child.stop() is Stop.NOT_RUNNING
    assert not recorder.of(Change.CRASHED)


def test_a_child_that_says_why_it_cannot_start_is_not_started_again(make_child: Any, tmp_path: Path) -> None:
    child, recorder = make_child("refuse")
    assert child.start() is Start.OK
    failed = wait_until(lambda: recorder.of(Change.FAILED), 30, "the start to fail")[0]
    assert failed.returncode == 2
    assert failed.message == "/nowhere/model.gguf: model file not found"
    assert not recorder.of(Change.READY) and not recorder.of(Change.CRASHED)
    assert len(recorder.of(Change.STARTED)) == 1


def test_a_clean_exit_nobody_asked_for_ends_the_watch(make_child: Any, tmp_path: Path) -> None:
    child, recorder = make_child("clean-exit")
    child.start()
    wait_until(lambda: recorder.of(Change.READY), 30, "the child to be ready")
    (tmp_path / "exit-now").touch()
    ended = wait_until(lambda: recorder.of(Change.ENDED), 30, "the child to end")[0]
    assert ended.returncode == 0
    assert len(runs(tmp_path)) == 1 and not recorder.of(Change.CRASHED)


def test_the_serve_command_carries_what_the_tray_was_started_with(tmp_path: Path) -> None:
    argv = serve_argv(
        "/py",
        config=tmp_path / "c.toml",
        simulate_vram="2GiB",
        host="127.0.0.1",
        port=8751,
        enable_faults=True,
    )
    assert argv == [
        "/py", "-m", "tray_app", "--config", str(tmp_path / "c.toml"), "serve", "--simulate-vram", "2GiB",
        "--host", "127.0.0.1", "--port", "8751", "--enable-faults",
    ]  # fmt: skip
    assert serve_argv("/py") == ["/py", "-m", "tray_app", "serve"]
    assert (PREVIOUS_EXIT_ENV, RESTARTED_BY_ENV) == ("FAILSOFT_PREVIOUS_EXIT", "FAILSOFT_RESTARTED_BY")
    assert exit_words(-11) == "signal 11 (SIGSEGV)" and exit_words(3) == "exit status 3"
