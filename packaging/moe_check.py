#!/usr/bin/env python3
"""`make moe-check`: Failsoft's Mixture-of-Experts placement against llama.cpp itself, on a GPU device that
any Linux machine has: the Vulkan build on Mesa's software rasteriser (lavapipe, `Vulkan0: llvmpipe`).

Run by hand, not in CI (the Vulkan build takes a long while once; the check then takes minutes):

    python packaging/moe_check.py                       # build if needed, check, write moe-check.json
    python packaging/moe_check.py --budgets 36,48,96    # budgets in MiB on Vulkan0

1. The Vulkan engine variant, built once into the engine cache (`failsoft engine build --backend vulkan`'s
   wheel; unpacked beside it, not installed anywhere). It needs `mesa-vulkan-drivers libvulkan-dev glslc
   spirv-headers` and Vulkan headers newer than Debian 12's 1.3.239: where the system's are older, Debian
   13's `libvulkan-dev` is fetched with apt-get (a private package list, nothing installed) and its headers
   alone unpacked into the engine cache, then given to the compiler (CPLUS_INCLUDE_PATH).
2. A tiny MoE GGUF with random weights (tests/support/tiny_moe.py, a bigger shape: 6 MiB of experts per
   block, so that llama.cpp's MiB-granular `--fit` can tell blocks apart).
3. For each budget: Failsoft's plan for a simulated GPU of that size standing for `Vulkan0` (no reserve: the
   budget is what the worker may use), and llama-server started with the command line Failsoft gives it
   (`-ngl`, `--n-cpu-moe`, `-c`, `-np`, ... plus `-lv 5` for the override lines). What llama.cpp printed per
   device must equal the plan: weights and KV cache exactly, the compute buffer within 5 %, the experts
   kept in RAM as planned (packaging/moe_compare.py).
4. llama-server again with `--fit on` in the same budget (`--fit-target`: Vulkan0's free memory less the
   budget; no `-ngl`/`--n-cpu-moe`, the same context and slots): its placement, read from the same lines,
   is weighed with Failsoft's tokens/s estimate; Failsoft's choice must be at least as fast.
5. A table on stdout and a JSON report (`--report`, default moe-check.json).

Exit status: 0 all held, 1 a figure did not hold, 2 the Vulkan build or its device is not to be had here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for folder in (ROOT, ROOT / "packaging"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import moe_compare  # noqa: E402

MIB = 1024 * 1024
DEFAULT_BUDGETS = (
    36,
    40,
    44,
    48,
    52,
    56,
    60,
    66,
    96,
)  # MiB; see docs/benchmarks.md for what each one exercises
DEVICE = "Vulkan0"
# Mesa's lavapipe is a CPU-type Vulkan device: ggml-vulkan skips those unless named.
VULKAN_ENV = {"GGML_VK_VISIBLE_DEVICES": "0"}
SYSTEM_PACKAGES = "mesa-vulkan-drivers libvulkan-dev glslc spirv-headers"
# The Vulkan headers the build is known to compile with (Debian 13's); Debian 12's 1.3.239 are too old.
HEADERS_MIN = 309
HEADERS_DEBIAN = ("trixie", "libvulkan-dev")
LOAD_TIMEOUT = 600.0  # seconds: lavapipe compiles its pipelines on a busy 2-core machine
_READY = re.compile(r"model loaded|listening on http")


def say(text: str) -> None:
    print(f"[moe-check] {text}", file=sys.stderr, flush=True)


class Unavailable(RuntimeError):
    """The Vulkan build or its device cannot be had here; the message says why and what to install."""


# ------------------------------------------------------------------------------------------------ build
def header_version(include: Path) -> int:
    header = include / "vulkan" / "vulkan_core.h"
    if not header.exists():
        return 0
    found = re.search(r"#define VK_HEADER_VERSION (\d+)", header.read_text(errors="replace"))
    return int(found.group(1)) if found else 0


def missing_system_parts() -> list[str]:
    missing = []
    if shutil.which("glslc") is None:
        missing.append("glslc")
    if header_version(Path("/usr/include")) == 0:
        missing.append("the Vulkan headers (libvulkan-dev)")
    if not list(Path("/usr/share/vulkan/icd.d").glob("lvp_icd*.json")):
        missing.append("Mesa's lavapipe driver (mesa-vulkan-drivers)")
    if not Path("/usr/include/spirv").exists():
        missing.append("spirv-headers")
    return missing


def newer_headers(cache: Path) -> Path:
    """An include folder with Vulkan headers the build compiles with: the system's when new enough, else
    Debian 13's, unpacked once into the engine cache (apt-get download into a private package list)."""
    system = Path("/usr/include")
    if header_version(system) >= HEADERS_MIN:
        return system
    suite, package = HEADERS_DEBIAN
    target = cache / f"vulkan-headers-{suite}" / "include"
    if header_version(target) >= HEADERS_MIN:
        return target
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise Unavailable(
            f"the system's Vulkan headers are 1.3.{header_version(system)}; the build needs "
            f"1.x.{HEADERS_MIN} or newer (Khronos Vulkan-Headers, or Debian 13's libvulkan-dev) and there "
            "is no apt-get here"
        )
    say(f"the system's Vulkan headers are 1.3.{header_version(system)}: fetching Debian 13's ({package})")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        (work / "lists" / "partial").mkdir(parents=True)
        (work / "sources.list").write_text(f"deb http://deb.debian.org/debian {suite} main\n")
        options = [
            "-o", f"Dir::Etc::SourceList={work / 'sources.list'}",
            "-o", "Dir::Etc::SourceParts=/nonexistent",
            "-o", f"Dir::State::Lists={work / 'lists'}",
            "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=",
        ]  # fmt: skip
        subprocess.run(["apt-get", *options, "update"], check=True, capture_output=True)
        subprocess.run(["apt-get", *options, "download", f"{package}/{suite}"], check=True, cwd=work)
        deb = next(work.glob(f"{package}_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "root")], check=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(work / "root" / "usr" / "include", target)
    return target


def vulkan_server(jobs: int, nice: int) -> Path:
    """llama-server of the cached Vulkan variant, built first when there is none."""
    from tray_app.engine_build import build

    missing = missing_system_parts()
    if missing:
        raise Unavailable(f"missing {', '.join(missing)}: apt-get install {SYSTEM_PACKAGES}")
    folder = build.variant_dir(build.LLAMA_CPP_PYTHON_VERSION, "vulkan")
    server = folder / "unpacked" / "llama_cpp" / "bin" / "llama-server"
    if server.exists():
        return server
    wheel = build.cached_wheel(folder, build.LLAMA_CPP_PYTHON_VERSION)
    if wheel is None:
        include = newer_headers(build.cache_root())
        if include != Path("/usr/include"):
            for name in ("CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH"):
                os.environ[name] = os.pathsep.join(filter(None, (str(include), os.environ.get(name))))
        os.environ.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(jobs))
        if nice:
            os.nice(nice)
        say(f"building the Vulkan engine once ({jobs} jobs, nice {nice}); headers from {include}")
        try:
            wheel = build.build_and_install(
                "vulkan", build_dir=build.cache_root() / "build-vulkan", python=sys.executable
            )
        except build.BuildError as error:
            raise Unavailable(str(error)) from error
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(folder / "unpacked")
    for path in (folder / "unpacked" / "llama_cpp" / "bin").iterdir():
        path.chmod(0o755)
    return server


def device_free_bytes(server: Path, device: str, env: dict[str, str]) -> int:
    """The free memory llama.cpp sees on `device` (`--list-devices`), which --fit plans against."""
    from tray_app.engine.devices import parse_device_list

    listed = subprocess.run(
        [str(server), "--list-devices"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    for found in parse_device_list(listed.stdout + listed.stderr).devices:
        if found.name == device:
            return found.free_bytes
    raise Unavailable(f"llama-server lists no {device}:\n{listed.stdout}{listed.stderr}")


# ------------------------------------------------------------------------------------------------ model
def tiny_moe_shape() -> Any:
    from tests.support.tiny_moe import TinyMoe

    return TinyMoe(n_layers=8, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=8, n_ff_exp=512)


def write_model(folder: Path) -> Path:
    from tests.support.tiny_moe import write_tiny_moe

    folder.mkdir(parents=True, exist_ok=True)
    return write_tiny_moe(folder / "tiny-moe.gguf", tiny_moe_shape())


def tensor_table(model: Path) -> dict[str, int]:
    import gguf

    return {tensor.name: int(tensor.n_bytes) for tensor in gguf.GGUFReader(model).tensors}


# ------------------------------------------------------------------------------------------------ runs
def failsoft_plan(model: Path, budget_bytes: int, device: str) -> tuple[Any, list[str]]:
    """The plan for a simulated GPU of `budget_bytes` named `device` (the default config, no reserve) and
    the worker's command line as the service builds it (tray_app.supervisor.profile, tray_app.engine.argv)."""
    from tray_app.budget.device import SimulatedDevice
    from tray_app.budget.model_info import inspect_model
    from tray_app.budget.plan_set import gpu_request
    from tray_app.budget.planner import plan_gpu
    from tray_app.config import Config
    from tray_app.supervisor.profile import gpu_profile

    cfg = Config()
    request = replace(gpu_request(cfg), reserve_percent=0.0, reserve_min_bytes=0)
    memory = SimulatedDevice(budget_bytes, device).memory()
    plan = plan_gpu(memory, inspect_model(model, use_cache=False), request)
    profile = gpu_profile(cfg, plan, model, memory.free_bytes)
    return plan, argv_for(profile)


def argv_for(profile: Any) -> list[str]:
    from tray_app.engine.argv import llama_server_argv

    return llama_server_argv(Path("llama-server"), profile, 0)[1:]


def fit_argv(failsoft: list[str], target_mib: int) -> list[str]:
    """Failsoft's command line with the placement left to llama.cpp: no -ngl, --n-cpu-moe or -ot, `--fit on`
    with `--fit-target` (MiB to leave free on the device); the context and slots stay as given."""
    argv: list[str] = []
    skip = False
    for word in failsoft:
        if skip:
            skip = False
            continue
        if word in ("--n-gpu-layers", "--n-cpu-moe", "--override-tensor", "--fit"):
            skip = True
            continue
        argv.append(word)
    return [*argv, "--fit", "on", "--fit-target", str(target_mib)]


def run_server(
    server: Path, argv: list[str], env: dict[str, str], log_path: Path, timeout: float = LOAD_TIMEOUT
) -> str:
    """Start llama-server (`-lv 5`: the override lines are debug output), wait until it has loaded or
    ended, stop it; its log."""
    from tray_app.supervisor.ports import free_port

    command = [str(server), *_with_port(argv, free_port()), "--log-verbosity", "5"]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("w") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env})
        try:
            while time.monotonic() - started < timeout and process.poll() is None:
                if _READY.search(log_path.read_text(errors="replace")):
                    break
                time.sleep(0.5)
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    return log_path.read_text(errors="replace")


def _with_port(argv: list[str], port: int) -> list[str]:
    out = list(argv)
    if "--port" in out:
        out[out.index("--port") + 1] = str(port)
    return out


def check_budget(
    server: Path,
    model: Path,
    tensors: dict[str, int],
    budget_mib: int,
    device: str,
    env: dict[str, str],
    logs: Path,
    device_free: int | None,
    timeout: float = LOAD_TIMEOUT,
) -> dict[str, Any]:
    """One budget: Failsoft's plan against what llama.cpp printed, and against --fit's placement (when the
    device's free memory is known) by the same tokens/s estimate."""
    plan, argv = failsoft_plan(model, budget_mib * MIB, device)
    share = plan_share(model)
    bandwidths = (plan.gpu_bandwidth, plan.cpu_bandwidth)
    log = run_server(server, argv, env, logs / f"failsoft-{budget_mib}.log", timeout)
    compared = moe_compare.compare_plan(plan.to_dict(), log, device)
    placed = moe_compare.placement_from_log(log, device)
    ours = moe_compare.estimate(placed, tensors, share, plan.n_parallel, bandwidths)
    result: dict[str, Any] = {
        "budget_mib": budget_mib,
        "plan": {
            "placement": _plan_words(plan),
            "n_gpu_layers": plan.n_gpu_layers,
            "n_cpu_moe": plan.n_cpu_moe,
            "cpu_expert_tensors": list(plan.cpu_expert_tensors),
            "n_ctx": plan.n_ctx,
            "n_parallel": plan.n_parallel,
            "tokens_per_second": round(plan.tokens_per_second, 1),
            "candidates": [
                {
                    "kind": c.kind,
                    "tokens_per_second": round(c.tokens_per_second, 1),
                    "fits": c.fits,
                    "chosen": c.chosen,
                }
                for c in plan.candidates
            ],
            "reason": plan.reason,
        },
        "argv": argv,
        "compare": compared,
        "failsoft_placement": placed.to_dict(),
        "failsoft_estimate": ours,
        "problems": list(compared["problems"]),
    }
    if abs(ours["tokens_per_second"] - plan.tokens_per_second) > max(1.0, plan.tokens_per_second * 0.001):
        result["problems"].append(
            f"the plan's estimate {plan.tokens_per_second:.1f} tokens/s differs from the same estimate over "
            f"llama.cpp's placement, {ours['tokens_per_second']:.1f}"
        )
    if device_free is None:
        return result
    target = max(-(-(device_free - budget_mib * MIB) // MIB), 0)
    fit_log = run_server(server, fit_argv(argv, target), env, logs / f"fit-{budget_mib}.log", timeout)
    fit_placed = moe_compare.placement_from_log(fit_log, device)
    fit_sizes = moe_compare.split_sides(moe_compare.per_backend(moe_compare.last_load(fit_log)), device)[0]
    theirs = (
        moe_compare.estimate(fit_placed, tensors, share, plan.n_parallel, bandwidths)
        if fit_placed.n_layers
        else None
    )
    result["fit"] = {
        "fit_target_mib": target,
        "placement": fit_placed.to_dict(),
        "device_used_mib": round(sum(fit_sizes.values()) / MIB, 2),
        "estimate": theirs,
    }
    result["problems"] += moe_compare.judge_speed(
        ours["tokens_per_second"], theirs["tokens_per_second"] if theirs else None
    )
    return result


def plan_share(model: Path) -> float:
    from tray_app.budget.model_info import inspect_model

    return inspect_model(model, use_cache=False).active_expert_share


def _plan_words(plan: Any) -> str:
    words = f"{plan.n_gpu_layers}/{plan.n_layers} layers"
    if plan.n_cpu_moe or plan.cpu_expert_tensors:
        n_blocks, single = plan.n_layers - 1, len(plan.cpu_expert_tensors)
        words += ", " + moe_compare.experts_words(plan.n_cpu_moe, n_blocks, single)
    return words


# ------------------------------------------------------------------------------------------------ report
def table(results: list[dict[str, Any]], device: str) -> str:
    """One line per budget: Failsoft's placement with its planned/printed sizes on the device and its
    estimate; --fit's placement, what it put on the device, and its estimate."""
    header = (
        f"{'budget':>7}  {'Failsoft on ' + device:<53} {'weights MiB':>13} {'KV MiB':>11} "
        f"{'compute MiB':>13} {'tok/s':>6}  {'--fit':<53} {'MiB':>6} {'tok/s':>6}  ok"
    )
    lines = [header, "-" * len(header)]
    for result in results:
        rows = result["compare"]["buffers"]
        fit = result.get("fit") or {}
        fit_words = (fit.get("placement") or {}).get("words", "-")
        fit_speed = (fit.get("estimate") or {}).get("tokens_per_second") or 0.0

        def pair(name: str, rows: dict[str, Any] = rows) -> str:
            return f"{rows[name]['planned_mib']:.2f}/{rows[name]['printed_mib']:.2f}"

        ours = result["failsoft_estimate"]["tokens_per_second"]
        lines.append(
            f"{result['budget_mib']:>3} MiB  {result['plan']['placement']:<53} {pair('weights'):>13} "
            f"{pair('kv'):>11} {pair('compute'):>13} {ours:>6.0f}  "
            f"{fit_words:<53} {fit.get('device_used_mib', 0.0):>6.2f} {fit_speed:>6.0f}  "
            f"{'yes' if not result['problems'] else 'NO'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budgets", default=",".join(map(str, DEFAULT_BUDGETS)), help="MiB on Vulkan0")
    parser.add_argument("--report", type=Path, default=Path("moe-check.json"), help="the JSON report")
    parser.add_argument("--work", type=Path, help="model and logs (default: a folder beside the report)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs for the one-time build")
    parser.add_argument("--nice", type=int, default=15, help="niceness of the one-time build")
    parser.add_argument("--no-fit", action="store_true", help="skip the --fit comparison")
    args = parser.parse_args(argv)
    budgets = [int(value) for value in args.budgets.split(",") if value.strip()]
    work = args.work or args.report.with_suffix("")
    started = time.monotonic()
    try:
        server = vulkan_server(args.jobs, args.nice)
        free = device_free_bytes(server, DEVICE, VULKAN_ENV)
    except (Unavailable, subprocess.CalledProcessError, OSError) as error:
        say(f"cannot run here: {error}")
        return 2
    model = write_model(work)
    tensors = tensor_table(model)
    say(f"{server}; {DEVICE} free {free / MIB:.0f} MiB; model {model} ({model.stat().st_size / MIB:.1f} MiB)")
    results = []
    for budget in budgets:
        say(f"budget {budget} MiB")
        results.append(
            check_budget(
                server,
                model,
                tensors,
                budget,
                DEVICE,
                VULKAN_ENV,
                work / "logs",
                None if args.no_fit else free,
            )
        )
    problems = [
        f"{result['budget_mib']} MiB: {problem}" for result in results for problem in result["problems"]
    ]
    report = {
        "check": "failsoft moe-check",
        "device": DEVICE,
        "device_free_mib": round(free / MIB),
        "server": str(server),
        "model_bytes": model.stat().st_size,
        "budgets": results,
        "problems": problems,
        "seconds": round(time.monotonic() - started, 1),
        "verdict": "passed" if not problems else "failed",
    }
    args.report.write_text(json.dumps(report, indent=2))
    print(table(results, DEVICE))
    for problem in problems:
        print(f"problem: {problem}")
    print(f"{report['verdict']} in {report['seconds']:.0f} s; report: {args.report}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
