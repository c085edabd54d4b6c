#!/usr/bin/env python3
"""`make gpu-check`: one check of Failsoft on a real NVIDIA GPU, prepared to run offline in one go.

Two modes:

    python3 packaging/gpu_check.py pack   # on a machine with the network (and the project's .venv)
    python3 packaging/gpu_check.py run    # on the GPU machine: needs no network (the default mode)

`pack` writes everything the check needs into `.gpu-check/carry/` (ignored by git, under 64 MiB together with
the working tree, so it can travel as one extra path beside it):

- `engine/`: llama.cpp (binding + `llama-server`) built HERE with CUDA for `--cuda-arch` (90: H100, H200),
  stripped (packaging/gpu_check_engine.py): the GPU machine installs it in seconds instead of compiling for
  minutes; built once per source, architecture and compiler (kept in `.gpu-check/pack/`);
- `llama-cpp-src.tar.gz`: llama-cpp-python's sdist trimmed to what a CUDA build of the binding and of
  `llama-server` compiles, for a card the carried engine was not built for;
- `wheels/`: the Python packages `failsoft serve` needs that a machine with Python, PyTorch and NumPy may
  lack (PySide6 is not among them: the check is headless; NumPy and torch are the machine's own);
- `model-skeleton.gguf.gz` and `model-skeleton.json`: the bundled model's file with its large tensors zeroed
  out (the 94 MiB file cannot travel). `run` fills those tensors with generated values again: the same
  layout, tokenizer, chat template and norm weights, with weights that are not the trained ones.

`run` goes as far as this machine allows, phase by phase, each with its own time budget (the total limit
only keeps later phases from starting), and writes the JSON report (`$OUT/gpu-check.json` when OUT is set,
else `gpu-check.json`) and the logs (under $OUT: at most 8 files in all) as each phase ends:

  host         Python, cores, compilers, CMake, nvcc, torch, the carried files, this machine's boot id
  gpu          nvidia-smi and NVML: without an NVIDIA GPU the check stops here (exit status 2)
  python_env   a virtual environment on the machine's own packages plus the carried wheels, offline
  engine       the carried engine installed when it was built for this card's architecture; else built here
               from the carried source (an interrupted build continues on the same machine)
  model        the bundled model, or the model rebuilt from the carried skeleton
  probe        where a native crash happens: `import llama_cpp`, a vocab-only load, the log callback,
               `failsoft serve` with and without CUDA devices, each in its own process (faulthandler on)
  smoke        `failsoft serve` on the real GPU until both workers are ready, and one chat on the GPU
  service      `failsoft doctor --json` and the status: device, plan, each worker's `runs_on` and `offload`
  planner      per buffer: the planner's prediction, llama.cpp's printed sizes and NVML's measurement
  watcher      another process takes 1 GiB on the card: the device watcher must list it, then drop it
  moe          the tiny MoE model planned for budgets on CUDA0: the plan against llama.cpp's printed buffers
               and override lines, and against llama.cpp's own --fit by the planner's tokens/s estimate
  pressure     torch takes the GPU's free memory until a real CUDA allocation fails; then requests of
               growing size until one needs new memory in the GPU worker: it must fail over exactly once
  bench        routed against direct on the same llama-server, 1/4/16 clients, streamed and not; the
               failover pause with the GPU worker SIGKILLed mid-stream at 100/1,000/4,000 prompt tokens,
               the mirror on and off
  teardown     the service stopped

Exit status: 0 passed, 1 a phase failed, a check did not hold or the time limit was spent first, 2 no NVIDIA
GPU here, 3 not prepared (nothing carried: run `pack` on a machine with the network first).

Standard library only at the top: the phases that need the project run in the check's own environment.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
from check_report import (  # noqa: E402
    MIB,
    PHASE_BUDGETS,
    SERVICE_PHASES,
    PhaseStop,
    Report,
    budget_of,
    default_report_path,
    say,
)
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
from gpu_check_engine import DEFAULT_CUDA_ARCH, ENGINE_NAME, pack_engine  # noqa: E402
from gpu_check_model import pack_model  # noqa: E402
from gpu_check_phases import (  # noqa: E402
    phase_engine,
    phase_gpu,
    phase_host,
    phase_model,
    phase_python_env,
)
from gpu_check_probe import phase_probe  # noqa: E402

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_NO_GPU = 2
EXIT_NOT_PREPARED = 3
WORK = ROOT / ".gpu-check"
CARRY = WORK / "carry"  # what travels to the GPU machine (one `carry` path)
STATE = WORK / "work"  # what the check makes there; kept between runs on the same machine
PACK_WORK = WORK / "pack"  # what `pack` builds here (the engine's build folder, cuBLAS for the link)
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
    engine = carried.get("engine")
    if archive or engine:
        skeleton = "a model skeleton" if carried.get("model_skeleton") else "no model skeleton"
        parts_carried = [
            f"engine for sm_{engine['arch']} {engine['bytes'] / MIB:.1f} MiB" if engine else "no engine",
            f"source archive {archive['bytes'] / MIB:.1f} MiB" if archive else "no source archive",
            f"{wheels.get('count', 0)} wheels",
            skeleton,
        ]
        carried_text = f"carried {carried.get('bytes', 0) / MIB:.1f} MiB: " + ", ".join(parts_carried)
    else:
        carried_text = "nothing carried (run `pack` first)"
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
    failed = [name for name, entry in phases.items() if entry.get("status") == "failed"]
    report.data["failed_phases"] = failed
    status = phases[stopped].get("status") if stopped is not None else None
    stopped_message = phases[stopped].get("message") if stopped is not None else None
    if status == "no_gpu":
        verdict, code = "no_gpu", EXIT_NO_GPU
        message = (
            "no NVIDIA GPU here: this check needs one; everything before that point ran: "
            f"{host_summary(phases.get('host') or {})}; GPU: {stopped_message}"
        )
    elif status == "not_prepared":
        verdict, code, message = "not_prepared", EXIT_NOT_PREPARED, str(stopped_message)
    elif failed:
        verdict, code = "failed", EXIT_FAILED
        message = f"failed in the {', '.join(failed)} phase(s): {phases[failed[0]].get('message')}"
    elif status == "out_of_time":
        verdict, code = "incomplete", EXIT_FAILED
        message = (
            f"the total time limit ({report.data.get('time_limit_seconds')} s) was spent before the "
            f"{stopped} phase; every phase before it ran"
        )
    elif report.data["problems"]:
        verdict, code = "failed", EXIT_FAILED
        message = "ran to the end, but: " + "; ".join(report.data["problems"])
    else:
        verdict, code, message = "passed", EXIT_PASSED, "every phase ran and every check held"
    if code == EXIT_FAILED and report.data["problems"] and not message.startswith("ran to the end"):
        message += "; problems: " + "; ".join(report.data["problems"][:5])
    report.data["verdict"] = verdict
    report.data["message"] = message
    report.data["seconds"] = round(sum(float(entry.get("seconds", 0)) for entry in phases.values()), 1)
    report.write()
    print(f"gpu-check: {verdict}: {message}", file=sys.stderr)
    print(f"gpu-check: report {report.path}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    deadline = time.time() + args.time_limit
    report = Report(args.report, deadline)
    carry, state = args.carry, args.state
    log_dir = state / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    report.data["carry"] = str(carry)
    report.data["budgets"] = PHASE_BUDGETS
    report.add_log_dirs(log_dir)
    os.environ["PYTHONFAULTHANDLER"] = "1"  # every Python the check starts prints its stacks if it crashes
    try:
        host = phase_host(report, carry, state)
        phase_gpu(report)
        if host.get("not_prepared"):
            with report.phase("engine"):
                raise PhaseStop("not_prepared", str(host["not_prepared"]))
        python = phase_python_env(report, carry, state / "venv")
        phase_engine(report, carry, state / "venv", state, log_dir)
        model = phase_model(report, carry, state / "venv", state)
        phase_probe(report, python, model, state, log_dir)
        # Its own script in the check's environment, where the project is importable.
        inner = [str(python), str(PACKAGING / "gpu_check_service.py"), "--report", str(report.path)]
        inner += ["--deadline", str(deadline), "--model", str(model), "--state", str(state)]
        say(f"{', '.join(SERVICE_PHASES)}: in the check's environment")
        report.write()
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        done = subprocess.run(inner, cwd=ROOT, env=env, timeout=budget_of(SERVICE_PHASES) + 60)
        report = Report.load(report.path, deadline)
        if done.returncode != 0:
            report.problem(f"the service phases' script ended with exit status {done.returncode}")
    except PhaseStop:
        pass
    except subprocess.TimeoutExpired:
        report = Report.load(report.path, deadline)
        report.problem("the service phases ran past the sum of their budgets")
    return summarize(report)


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) if folder.exists() else 0


def tree_bytes() -> int:
    """The working tree that travels beside the carried folder (tracked files)."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False).stdout
    return sum(
        (ROOT / name).stat().st_size
        for name in tracked.decode().split("\0")
        if name and (ROOT / name).is_file()
    )


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
    if args.cuda_arch:
        say(f"engine: CUDA for sm_{args.cuda_arch} (the first time: a long compile; then from {PACK_WORK})")
        summary["engine"] = pack_engine(carry, PACK_WORK, sdist, args.cuda_arch, sys.executable)
        build = summary["engine"]["build"]
        say(
            f"engine: {summary['engine']['bytes'] / MIB:.1f} MiB carried ({summary['engine']['wheel']}), "
            f"built in {build['seconds']:.0f} s on {build['cores']} cores"
        )
    else:
        shutil.rmtree(carry / ENGINE_NAME, ignore_errors=True)  # none: the GPU machine builds one
    total, tree = folder_bytes(carry), tree_bytes()
    if total + tree > MAX_CARRY_BYTES and (carry / ENGINE_NAME).exists():
        # The engine is what saves the lease; the source is only for another card: it goes first.
        (carry / ARCHIVE_NAME).unlink(missing_ok=True)
        summary["source"]["left_out"] = "over the size limit beside the engine: no build on the GPU machine"
        total = folder_bytes(carry)
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
    parser.add_argument(
        "--time-limit",
        type=float,
        default=480.0,
        help="run: seconds after which no further phase starts (each phase keeps its own budget)",
    )
    parser.add_argument(
        "--cuda-arch",
        default=DEFAULT_CUDA_ARCH,
        help="pack: the GPU's CUDA architecture to build the engine for (90: H100, H200; '' for none)",
    )
    parser.add_argument("--python-version", default=DEVICE_PYTHON, help="pack: the GPU machine's Python")
    args = parser.parse_args(argv)
    args.report = args.report or default_report_path()
    if args.mode == "pack":
        return pack(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
