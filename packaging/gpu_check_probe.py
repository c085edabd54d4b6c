"""The GPU check's probe phase: where does a native crash happen? Cheap steps, each in its own process with
`PYTHONFAULTHANDLER=1` and a timeout, from the smallest to the whole service; each step's exit status (a
signal by name), time and the end of its output are kept:

  import        `import llama_cpp` (the engine's libraries load: CUDA, cuBLAS, the driver)
  vocab_only    `llama_cpp.Llama(model, vocab_only=True)`: the model file read, no weights on a device
  log_callback  Failsoft's llama.cpp log callback set (tray_app/engine/llama_log.py), then the same load
  serve_gpu     `failsoft serve` on the GPU, ~10 s to ready (the service once died with SIGSEGV 5.5 s after
                its start, printing nothing)
  serve_no_gpu  the same with `CUDA_VISIBLE_DEVICES=` (no CUDA device visible)

A step that crashes does not stop the check: the report names it (`first_crash`), and the later phases show
what follows. Standard library only: it runs from `gpu_check.py`, each step in the check's environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from check_report import Report, say, tail

ROOT = Path(__file__).resolve().parent.parent
STEP_TIMEOUT = 60.0  # seconds for each Python step
SERVE_READY = 15.0  # seconds a `failsoft serve` step waits for both workers (about 10 s on a real card)
SERVE_STOP = 10.0

IMPORT = "import llama_cpp, sys; print(llama_cpp.__version__, llama_cpp.__file__)"
VOCAB_ONLY = (
    "import sys, llama_cpp\n"
    "model = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)\n"
    "print('vocab', model.n_vocab())\n"
)
LOG_CALLBACK = (
    "import sys, llama_cpp\n"
    "from tray_app.engine.llama_log import capture_llama_log\n"
    "with capture_llama_log() as capture:\n"
    "    model = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)\n"
    "print('vocab', model.n_vocab(), 'logged', len(capture.text), 'chars')\n"
)


def signal_name(code: int | None) -> str | None:
    """ "SIGSEGV" for a process killed by signal 11 (exit status -11), else None."""
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def step_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    env.update(extra or {})
    return env


def run_step(command: list[str], log_path: Path, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """One step in its own process group: exit status, signal, seconds, the end of its output."""
    started = time.monotonic()
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )
        timed_out = False
        try:
            code: int | None = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            stop_group(process)
            code = process.returncode
    output = log_path.read_text(errors="replace")
    return {
        "exit": code,
        "signal": signal_name(code),
        "timed_out": timed_out,
        "seconds": round(time.monotonic() - started, 2),
        "output_tail": tail(output, 25),
    }


def stop_group(process: subprocess.Popen[bytes], grace: float = SERVE_STOP) -> None:
    """SIGTERM the step's process group (a service stops its workers), then SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_config(model: Path) -> str:
    """The smallest config for a probe's service: the model, both workers, loopback, no key."""
    return (
        f"[model]\npath = {json.dumps(str(model))}\n\n"
        '[server]\nhost = "127.0.0.1"\napi_key = ""\n\n'
        "[cpu]\nenabled = true\nwarm = true\n"
    )


def fetch_status(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/failsoft/status", timeout=2) as response:
            status: dict[str, Any] = json.loads(response.read())
            return status
    except (OSError, ValueError):
        return None


def worker_states(status: dict[str, Any] | None) -> dict[str, Any]:
    workers = (status or {}).get("workers") or {}
    return {role: (workers.get(role) or {}).get("state") for role in ("gpu", "cpu")}


def all_ready(states: dict[str, Any]) -> bool:
    present = [state for state in states.values() if state not in (None, "absent")]
    return bool(present) and all(state == "ready" for state in present)


def serve_step(
    python: str, model: Path, work: Path, log_path: Path, extra_env: dict[str, str]
) -> dict[str, Any]:
    """`failsoft serve` for up to SERVE_READY seconds: did it get both workers ready, or die (how)?"""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "config.toml"
    config.write_text(serve_config(model), encoding="utf-8")
    port = free_port()
    env = step_env(
        {
            "FAILSOFT_CONFIG": str(config),
            "FAILSOFT_DATA_DIR": str(work / "data"),
            "FAILSOFT_LOG_DIR": str(work / "logs"),
            "FAILSOFT_RUNTIME_DIR": str(work / "run"),
            **extra_env,
        }
    )
    started = time.monotonic()
    result: dict[str, Any] = {"port": port, "env": extra_env}
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [python, "-m", "tray_app", "serve", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        states: dict[str, Any] = {}
        status = None
        while time.monotonic() - started < SERVE_READY and process.poll() is None:
            status = fetch_status(port) or status
            states = worker_states(status)
            if all_ready(states):
                result["ready_after_seconds"] = round(time.monotonic() - started, 2)
                break
            time.sleep(0.3)
        died = process.poll()
        result["died_by_itself"] = died is not None
        result["seconds"] = round(time.monotonic() - started, 2)
        result["workers"] = states
        result["device"] = (status or {}).get("device")
        stop_group(process)
    code = process.returncode
    result["exit"] = code if died is not None else None
    result["signal"] = signal_name(code) if died is not None else None
    result["exit_after_stop"] = code if died is None else None
    output = log_path.read_text(errors="replace")
    result["output_tail"] = tail(output, 30)
    for role in ("gpu", "cpu"):
        worker_log = work / "logs" / f"{role}-worker.log"
        if worker_log.exists():
            result[f"{role}_worker_log_tail"] = tail(worker_log.read_text(errors="replace"), 12)
            with log_path.open("a") as log:
                log.write(f"\n===== {role}-worker.log =====\n" + worker_log.read_text(errors="replace"))
    return result


def crashed(result: dict[str, Any]) -> bool:
    """The step died by itself: a signal, or an exit status other than 0 (not the probe stopping it)."""
    if result.get("timed_out"):
        return False
    return bool(result.get("signal")) or result.get("exit") not in (None, 0)


def phase_probe(report: Report, python: Path, model: Path, state: Path, log_dir: Path) -> dict[str, Any]:
    with report.phase("probe") as entry:
        steps: dict[str, Any] = {}
        entry["steps"] = steps
        py = str(python)
        for name, command in (
            ("import", [py, "-c", IMPORT]),
            ("vocab_only", [py, "-c", VOCAB_ONLY, str(model)]),
            ("log_callback", [py, "-c", LOG_CALLBACK, str(model)]),
        ):
            steps[name] = run_step(command, log_dir / f"probe-{name}.log", STEP_TIMEOUT, step_env())
            say(f"probe: {name}: exit {steps[name]['exit']} in {steps[name]['seconds']} s")
            report.write()
        for name, extra in (("serve_gpu", {}), ("serve_no_gpu", {"CUDA_VISIBLE_DEVICES": ""})):
            work = state / "probe" / name
            steps[name] = serve_step(py, model, work, log_dir / f"probe-{name}.log", extra)
            ready = steps[name].get("ready_after_seconds")
            say(f"probe: {name}: {'ready after ' + str(ready) + ' s' if ready else 'not ready'}, "
                f"exit {steps[name].get('exit')}")  # fmt: skip
            report.write()
        entry["timed_out"] = [name for name, result in steps.items() if result.get("timed_out")]
        for name in entry["timed_out"]:
            report.problem(f"probe: {name} did not end within {STEP_TIMEOUT:.0f} s (stopped)")
        crashes = [name for name, result in steps.items() if crashed(result)]
        entry["crashes"] = crashes
        entry["first_crash"] = crashes[0] if crashes else None
        for name in crashes:
            result = steps[name]
            how = result.get("signal") or f"exit {result.get('exit')}"
            report.problem(f"probe: {name} died ({how}): {tail(str(result.get('output_tail')), 3)}")
        if not steps["serve_gpu"].get("ready_after_seconds"):
            report.problem(f"probe: failsoft serve was not ready within {SERVE_READY:.0f} s on the GPU")
        return entry
