#!/usr/bin/env python3
"""`make gpu-check`: one check of Failsoft on a real NVIDIA GPU, prepared to run offline in one go.

Two modes:

    python3 packaging/gpu_check.py pack   # on a machine with the network (and the project's .venv)
    python3 packaging/gpu_check.py run    # on the GPU machine: needs no network (the default mode)

`pack` writes everything the check needs into `.gpu-check/carry/` (ignored by git, under 64 MiB in all, so it
can travel as one extra path beside the working tree):

- `llama-cpp-src.tar.gz`: llama-cpp-python's sdist trimmed to what a CUDA build of the binding and of
  `llama-server` compiles (no git history, docs, test models, web UI sources, other GPU backends);
- `wheels/`: the Python packages `failsoft serve` needs that a machine with Python, PyTorch and NumPy may
  lack (PySide6 is not among them: the check is headless; NumPy and torch are the machine's own);
- `model-skeleton.gguf.gz` and `model-skeleton.json`: the bundled model's file with its large tensors zeroed
  out (it compresses to a few MiB; the 94 MiB file cannot travel). `run` fills those tensors with generated
  values again: the same file, byte for byte in its layout (every tensor's name, type, shape and offset, the
  tokenizer, the chat template and the real norm weights), with weights that are not the trained ones. The
  planner's figures depend on the layout alone, so they are the bundled model's.

`run` goes as far as this machine allows and writes one JSON report (`$OUT/gpu-check.json` when OUT is
set, else `gpu-check.json`), each phase with its time, its budget and what it found:

  host         Python, cores, compilers, CMake, nvcc, torch, the carried files
  gpu          nvidia-smi and NVML: without an NVIDIA GPU the check stops here (exit status 2)
  python_env   a virtual environment on the machine's own packages plus the carried wheels, offline
  engine       llama.cpp built with CUDA for the local architecture from the carried source (cached by
               architecture; an interrupted build continues on the next run)
  model        the bundled model, or the model rebuilt from the carried skeleton
  service      `failsoft doctor --json`, then `failsoft serve` on the real GPU until both workers are ready
  planner      per buffer: the planner's prediction, llama.cpp's printed sizes and NVML's measurement
  moe          the tiny MoE model planned for budgets on CUDA0: the plan against llama.cpp's printed buffers
               and override lines, and against llama.cpp's own --fit by the planner's tokens/s estimate
  pressure     torch takes the GPU's free memory until a real CUDA allocation fails; then requests of
               growing size until one needs new memory in the GPU worker: it must fail over exactly once
  teardown     the service stopped, its logs kept

Exit status: 0 passed, 1 a phase failed or a check did not hold, 2 no NVIDIA GPU here, 3 not prepared (no
carried source: run `pack` on a machine with the network first).

Standard library only at the top: the phases that need the project run in the check's own environment.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
if str(PACKAGING) not in sys.path:
    sys.path.insert(0, str(PACKAGING))

# The packaging folder's own modules, standard library only.
import build_engine  # noqa: E402
from check_report import MIB, PhaseStop, Report, default_report_path, say  # noqa: E402
from gpu_check_carry import (  # noqa: E402
    ARCHIVE_NAME,
    DEVICE_PYTHON,
    MANIFEST_NAME,
    SKELETON_NAME,
    WHEELS_NAME,
    download_wheels,
    sdist_path,
    trim_sdist,
)
from gpu_check_model import pack_model  # noqa: E402
from gpu_check_phases import (  # noqa: E402
    phase_engine,
    phase_gpu,
    phase_host,
    phase_model,
    phase_python_env,
)

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_NO_GPU = 2
EXIT_NOT_PREPARED = 3
WORK = ROOT / ".gpu-check"
CARRY = WORK / "carry"  # what travels to the GPU machine (one `carry` path)
STATE = WORK / "work"  # what the check makes there; kept between runs on the same machine
MAX_ARCHIVE_BYTES = 50 * MIB
MAX_CARRY_BYTES = 64 * MIB  # everything that travels: the carried folder plus the working tree


def host_summary(host: dict[str, Any]) -> str:
    """The host phase in one line: what the machine has for the check, and what it lacks."""
    tools = host.get("tools") or {}
    names = ("cmake", "ninja", "c++", "nvcc", "cublas")
    found = [name for name in names if (tools.get(name) or {}).get("path")]
    missing = [name for name in names if name not in found]
    carried = host.get("carried") or {}
    archive = carried.get("archive")
    wheels = carried.get("wheels") or {}
    torch = host.get("torch") or {}
    python, machine = host.get("python") or {}, host.get("machine") or {}
    if archive:
        skeleton = "a model skeleton" if carried.get("model_skeleton") else "no model skeleton"
        carried_text = (
            f"carried {carried.get('bytes', 0) / MIB:.1f} MiB: source archive {archive['bytes'] / MIB:.1f} "
            f"MiB, {wheels.get('count', 0)} wheels, {skeleton}"
        )
    else:
        carried_text = "no carried source (run `pack` first)"
    nvcc = (tools.get("nvcc") or {}).get("version")
    parts = [
        f"host checked: Python {python.get('version')}, {machine.get('cores')} cores",
        "tools "
        + ", ".join(found)
        + (f" (nvcc {nvcc})" if nvcc else "")
        + (f", missing {', '.join(missing)}" if missing else ""),
        carried_text,
        f"torch {torch['version']}" if torch.get("installed") else "torch not installed (no pressure step)",
    ]
    return "; ".join(parts)


def summarize(report: Report) -> int:
    """The verdict, a few lines on stderr, and the exit status."""
    phases = report.phases
    stopped = next(
        (name for name, entry in phases.items() if entry.get("status") not in ("ok", "skipped")), None
    )
    if stopped is not None and phases[stopped].get("status") == "no_gpu":
        verdict, code = "no_gpu", EXIT_NO_GPU
        message = (
            "no NVIDIA GPU here: this check needs one; everything before that point ran: "
            f"{host_summary(phases.get('host') or {})}; GPU: {phases[stopped].get('message')}"
        )
    elif stopped is not None and phases[stopped].get("status") == "not_prepared":
        verdict, code, message = "not_prepared", EXIT_NOT_PREPARED, str(phases[stopped].get("message"))
    elif stopped is not None:
        verdict, code = "failed", EXIT_FAILED
        message = f"stopped in the {stopped} phase: {phases[stopped].get('message')}"
    elif report.data["problems"]:
        verdict, code = "failed", EXIT_FAILED
        message = "ran to the end, but: " + "; ".join(report.data["problems"])
    else:
        verdict, code, message = "passed", EXIT_PASSED, "every phase ran and every check held"
    report.data["verdict"] = verdict
    report.data["message"] = message
    report.data["seconds"] = round(sum(float(entry.get("seconds", 0)) for entry in phases.values()), 1)
    report.write()
    print(f"gpu-check: {verdict}: {message}", file=sys.stderr)
    print(f"gpu-check: report {report.path}", file=sys.stderr)
    return code


def copy_logs(log_dir: Path, report_path: Path) -> None:
    """Logs next to the report when OUT is set (each at most 8 MiB: the end is kept)."""
    if not os.environ.get("OUT") or not log_dir.exists():
        return
    for log in sorted(log_dir.glob("*.log")):
        data = log.read_bytes()[-8 * MIB :]
        (report_path.parent / f"gpu-check-{log.name}").write_bytes(data)


def run(args: argparse.Namespace) -> int:
    deadline = time.time() + args.time_limit
    report = Report(args.report, deadline)
    carry, state = args.carry, args.state
    log_dir = state / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    report.data["carry"] = str(carry)
    try:
        host = phase_host(report, carry)
        phase_gpu(report)
        if not (carry / ARCHIVE_NAME).exists():
            with report.phase("engine", 1):
                raise PhaseStop("not_prepared", str(host.get("not_prepared")))
        python = phase_python_env(report, carry, state / "venv")
        phase_engine(report, carry, state / "venv", state, log_dir)
        model = phase_model(report, carry, state / "venv", state)
        # Its own script in the check's environment, where the project is importable.
        inner = [str(python), str(PACKAGING / "gpu_check_service.py"), "--report", str(report.path)]
        inner += ["--deadline", str(deadline), "--model", str(model), "--state", str(state)]
        say("service, planner and pressure phases run in the check's environment")
        report.write()
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        subprocess.run(inner, cwd=ROOT, env=env, timeout=max(report.remaining(), 10))
        report = Report.load(report.path, deadline)
    except PhaseStop:
        pass
    except subprocess.TimeoutExpired:
        report = Report.load(report.path, deadline)
        report.problem("the service phases ran out of the check's time")
    copy_logs(log_dir, report.path)
    return summarize(report)


def pack(args: argparse.Namespace) -> int:
    """Everything the GPU machine needs, into the carried folder; sizes checked."""
    carry: Path = args.carry
    carry.mkdir(parents=True, exist_ok=True)
    sdist = sdist_path()
    if not sdist.exists():
        sdist = build_engine.fetch_sdist(sys.executable, build_engine.LLAMA_CPP_PYTHON_VERSION)
    summary: dict[str, Any] = {"source": trim_sdist(sdist, carry / ARCHIVE_NAME)}
    say(f"source archive: {summary['source']['archive_bytes'] / MIB:.1f} MiB")
    summary["wheels"] = download_wheels(carry / WHEELS_NAME, args.python_version)
    say(f"wheels: {len(summary['wheels']['wheels'])}, {summary['wheels']['bytes'] / MIB:.1f} MiB")
    sys.path.insert(0, str(ROOT))
    from tray_app import paths

    model = paths.bundled_model_path()
    if model is None:
        say("error: the bundled model is not installed here (make .venv/.installed installs it)")
        return 1
    summary["model"] = pack_model(model, carry / SKELETON_NAME, carry / MANIFEST_NAME)
    say(f"model skeleton: {summary['model']['skeleton_bytes'] / MIB:.1f} MiB")
    total = sum(path.stat().st_size for path in carry.rglob("*") if path.is_file())
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False).stdout
    tree = sum(
        (ROOT / name).stat().st_size
        for name in tracked.decode().split("\0")
        if name and (ROOT / name).is_file()
    )
    summary["carried_bytes"] = total
    summary["working_tree_bytes"] = tree
    (carry / "pack.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(json.dumps(summary, indent=2))
    problems = []
    if summary["source"]["archive_bytes"] > MAX_ARCHIVE_BYTES:
        problems.append(f"the source archive is over {MAX_ARCHIVE_BYTES // MIB} MiB")
    if total + tree > MAX_CARRY_BYTES:
        problems.append(f"the carried folder and the working tree are over {MAX_CARRY_BYTES // MIB} MiB")
    for problem in problems:
        say(f"error: {problem}")
    say(f"carried: {total / MIB:.1f} MiB in {carry} (+ {tree / MIB:.1f} MiB of tracked files)")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", nargs="?", default="run", choices=("run", "pack"))
    parser.add_argument(
        "--report", type=Path, default=None, help="the JSON report (default: $OUT/gpu-check.json)"
    )
    parser.add_argument("--carry", type=Path, default=CARRY, help="the carried folder")
    parser.add_argument("--state", type=Path, default=STATE, help="where the check builds and runs")
    parser.add_argument("--time-limit", type=float, default=570.0, help="seconds for the whole run")
    parser.add_argument("--python-version", default=DEVICE_PYTHON, help="pack: the GPU machine's Python")
    args = parser.parse_args(argv)
    args.report = args.report or default_report_path()
    if args.mode == "pack":
        return pack(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
