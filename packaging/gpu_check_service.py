"""The GPU check's phases that need the project (`SERVICE_PHASES`: smoke, service, planner, watcher, moe,
pressure, bench, teardown): a script that `packaging/gpu_check.py` runs in the check's own environment once
the CUDA engine is installed, the model is there and the probe ran. It continues the report that run left.

The functions that judge (buffer comparison, the failover's verdict) are pure and tested on sample numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomli_w
from check_report import MIB, PhaseStop, Report, say, tail
from gpu_check_bench import phase_bench
from gpu_check_moe import phase_moe
from gpu_check_watcher import phase_watcher
from llama_buffers import KINDS, last_load, per_backend

from tray_app.budget.device import nvml_memory
from tray_app.config import Config, from_dict
from tray_app.drill.client import ServiceClient
from tray_app.drill.launcher import DRILL_SUPERVISOR, service_status
from tray_app.engine.devices import is_gpu_buffer
from tray_app.host.launch import ServeProcess, spawn_serve, stop_process_tree, workers_ready


# ------------------------------------------------------------------------------------------ buffers (pure)
def _side(printed: dict[str, dict[str, int]], on_gpu: bool) -> dict[str, int]:
    backends = [sizes for name, sizes in printed.items() if is_gpu_buffer(name) == on_gpu]
    return {kind: sum(sizes[kind] for sizes in backends) for kind in KINDS}


# Relative tolerance per buffer (printed sizes are rounded to 0.01 MiB: a small absolute slack too). The KV
# cache and the weights are computed exactly by the planner; the compute buffer is an estimate.
TOLERANCE = {"weights": 0.01, "host_weights": 0.01, "kv": 0.01, "output": 0.01, "compute": 0.15}
SLACK_BYTES = 64 * 1024


def _row(predicted: int | None, printed: int, tolerance: float) -> dict[str, Any]:
    predicted = int(predicted or 0)
    difference = predicted - printed
    within = abs(difference) <= max(SLACK_BYTES, tolerance * max(printed, predicted))
    return {
        "predicted_bytes": predicted,
        "printed_bytes": printed,
        "difference_bytes": difference,
        "ratio": round(predicted / printed, 4) if printed else None,
        "tolerance": tolerance,
        "within": within,
    }


def compare_buffers(
    plan: dict[str, Any], printed: dict[str, dict[str, int]], measured_bytes: int | None
) -> dict[str, Any]:
    """The planner's prediction for each buffer against llama.cpp's printed size, and the device total
    against what NVML measured for the GPU worker's process (None: NVML could not attribute it)."""
    device, host = _side(printed, True), _side(printed, False)
    rows = {
        "weights": _row(plan.get("weights_bytes"), device["model"], TOLERANCE["weights"]),
        "host_weights": _row(plan.get("host_weights_bytes"), host["model"], TOLERANCE["host_weights"]),
        "kv": _row(plan.get("kv_bytes"), device["kv"], TOLERANCE["kv"]),
        "compute": _row(plan.get("compute_bytes"), device["compute"], TOLERANCE["compute"]),
        "output": _row(plan.get("output_bytes"), device["output"] + host["output"], TOLERANCE["output"]),
    }
    predicted_device = sum(int(plan.get(key) or 0) for key in ("weights_bytes", "kv_bytes", "compute_bytes"))
    printed_device = sum(device.values())
    total: dict[str, Any] = {
        "predicted_device_bytes": predicted_device,
        "printed_device_bytes": printed_device,
        "printed_host_compute_bytes": host["compute"],
        "measured_process_bytes": measured_bytes,
    }
    if measured_bytes:
        # What the process holds beyond its printed buffers: the CUDA context, cuBLAS, the memory pool.
        total["unaccounted_bytes"] = measured_bytes - printed_device
        total["measured_over_predicted"] = (
            round(measured_bytes / predicted_device, 4) if predicted_device else None
        )
        total["measured_over_printed"] = round(measured_bytes / printed_device, 4) if printed_device else None
    return {
        "buffers": rows,
        "device_total": total,
        "outside_tolerance": [name for name, row in rows.items() if not row["within"]],
    }


# ------------------------------------------------------------------------------------------ failover (pure)
OOM_EVIDENCE = re.compile(
    r"out of memory|cudaMalloc failed|failed to allocate|CUDA error|cuMemCreate|OutOfMemory", re.IGNORECASE
)


def judge_failover(jobs: list[dict[str, Any]], gpu_log: str) -> dict[str, Any]:
    """Did the first job whose GPU attempt failed fail over exactly once: two attempts, the GPU one failed
    with a memory error, the CPU one completed, one answer to the client? Jobs before it must have been
    served by the GPU in one attempt."""
    failed_index = next(
        (
            index
            for index, job in enumerate(jobs)
            if any(attempt.get("outcome") == "failed" for attempt in job.get("attempt_log") or [])
        ),
        None,
    )
    problems: list[str] = []
    if failed_index is None:
        largest = max((int(job.get("prompt_words") or 0) for job in jobs), default=0)
        return {
            "exercised": False,
            "passed": False,
            "problems": [
                "no GPU attempt failed: the GPU worker served every request with the device's memory taken "
                f"(prompts up to about {largest} words), so it needed no new device memory"
            ],
        }
    for job in jobs[:failed_index]:
        if job.get("worker") != "gpu" or int(job.get("attempts") or 0) != 1:
            problems.append(
                f"job {job.get('id')} before the failure ran on {job.get('worker')} in "
                f"{job.get('attempts')} attempt(s)"
            )
    job = jobs[failed_index]
    log = job.get("attempt_log") or []
    if job.get("state") != "completed":
        problems.append(f"the job ended {job.get('state')}, not completed")
    if len(log) != 2 or int(job.get("attempts") or 0) != 2:
        problems.append(f"{len(log)} attempts recorded (attempts={job.get('attempts')}), expected 2")
    if log and (log[0].get("worker"), log[0].get("outcome")) != ("gpu", "failed"):
        problems.append(f"first attempt: {log[0].get('worker')} {log[0].get('outcome')}, expected gpu failed")
    if len(log) > 1 and (log[1].get("worker"), log[1].get("outcome")) != ("cpu", "completed"):
        problems.append(
            f"second attempt: {log[1].get('worker')} {log[1].get('outcome')}, expected cpu completed"
        )
    completed = sum(1 for attempt in log if attempt.get("outcome") == "completed")
    if completed != 1:
        problems.append(f"{completed} completed attempts, expected exactly 1")
    if job.get("answers_to_client") != 1:
        problems.append(f"the client received {job.get('answers_to_client')} answers, expected 1")
    evidence = [line.strip() for line in gpu_log.splitlines() if OOM_EVIDENCE.search(line)]
    if not evidence:
        problems.append("the GPU worker's log shows no failed CUDA allocation")
    return {
        "exercised": True,
        "passed": not problems,
        "job_index": failed_index,
        "failure": (log[0].get("error") if log else None),
        "allocation_failure_lines": evidence[:8],
        "problems": problems,
    }


WORDS = (
    "river", "stone", "garden", "window", "morning", "yellow", "bridge", "market", "winter", "candle",
    "forest", "silver", "ocean", "mountain", "letter", "kitchen", "summer", "valley", "planet", "harbor",
)  # fmt: skip


def prompt_words(count: int, salt: int) -> str:
    """About `count` tokens of plain words (one token each, mostly); `salt` keeps prompts apart (no reuse of
    a cached prompt)."""
    words = [WORDS[(index * 7 + salt) % len(WORDS)] for index in range(count)]
    return f"Request {salt}. Repeat the last word of this list: " + " ".join(words)


# ------------------------------------------------------------------------------------------ the service
# The GPU worker's context over its slots: 8192 a slot (SmolLM2's trained context) with the default 4 slots,
# so that one slot holds the bench's 4,000-token prompt (the default, 8192 over 4 slots, holds 2,048).
GPU_CONTEXT = 32768


def service_settings(model: Path) -> dict[str, Any]:
    """The default config on the real GPU with the given model but for a larger GPU context (GPU_CONTEXT):
    CPU worker warm, automatic fallback, quick failure detection, loopback only."""
    data = Config().to_dict()
    data["model"]["path"] = str(model)
    data["budget"]["max_ctx"] = GPU_CONTEXT
    data["cpu"].update(enabled=True, warm=True)
    data["server"].update(host="127.0.0.1", api_key="")
    data["failover"].update(fallback="auto", deadline=300.0)
    data["supervisor"].update(DRILL_SUPERVISOR)
    from_dict(data, source="gpu-check config")
    return data


def service_env(root: Path, config_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "FAILSOFT_CONFIG": str(config_path),
        "FAILSOFT_DATA_DIR": str(root / "data"),
        "FAILSOFT_LOG_DIR": str(root / "logs"),
    }


def worker_view(worker: dict[str, Any]) -> dict[str, Any]:
    health = worker.get("health") or {}
    keys = ("n_ctx", "n_parallel", "n_gpu_layers", "runs_on", "offload", "buffers", "load_seconds", "pid")
    return {
        "state": worker.get("state"),
        "pid": worker.get("pid") or health.get("pid"),
        "restarts": worker.get("restarts"),
        "last_failure": worker.get("last_failure"),
        **{key: health.get(key) for key in keys if key != "pid"},
    }


def status_view(status: Mapping[str, Any]) -> dict[str, Any]:
    workers = status.get("workers") or {}
    return {
        "device": status.get("device"),
        "target": status.get("target"),
        "engine": status.get("engine"),
        "plan": status.get("plan"),
        "cpu_plan": status.get("cpu_plan"),
        "caps": status.get("caps"),
        "workers": {role: worker_view(workers.get(role) or {}) for role in ("gpu", "cpu")},
    }


def process_end(process: Any) -> dict[str, Any]:
    """How a process ended: its exit status, and the signal by name when one killed it."""
    code = process.poll()
    signal_name = None
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            signal_name = signal.Signals(-code).name
    return {"exit": code, "signal": signal_name}


SMOKE_QUESTION = "Say hello in one short sentence."


async def _smoke_chat(service: ServeProcess) -> dict[str, Any]:
    client = ServiceClient(service.base_url, admin=service.admin_token)
    try:
        body = {
            "model": "default",
            "messages": [{"role": "user", "content": SMOKE_QUESTION}],
            "max_tokens": 16,
            "temperature": 0,
            "seed": 1,
        }
        answer = await client.chat(body)
        found: dict[str, Any] = {
            "http_status": answer.status,
            "text": answer.text[:200],
            "seconds": round(answer.ended_at - answer.started_at, 2),
            "device": (answer.failsoft or {}).get("device"),
            "client_error": answer.error or answer.transport_error or None,
        }
        if answer.job_id:
            record = await client.wait_job_final(answer.job_id, timeout=60)
            found.update({key: record.get(key) for key in ("state", "worker", "attempts", "attempt_log")})
        return found
    finally:
        await client.aclose()


def phase_smoke(report: Report, model: Path, root: Path) -> ServeProcess:
    """`failsoft serve` on the real GPU until both workers are ready (PYTHONFAULTHANDLER=1: a native crash
    prints Python's stacks), then one chat that the GPU worker must answer. The service's output (stdout and
    stderr) stays in the report, whatever happened."""
    with report.phase("smoke") as entry:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        config_path = root / "config.toml"
        config_path.write_text(tomli_w.dumps(service_settings(model)), encoding="utf-8")
        entry["config"] = str(config_path)
        os.environ["PYTHONFAULTHANDLER"] = "1"  # the service inherits it
        started = time.monotonic()
        # Faults enabled (armed only by the bench, to kill the GPU worker mid-stream).
        service = spawn_serve(root, config_path, args=["--enable-faults"])
        entry["url"] = service.base_url
        entry["serve_log"] = str(service.output_path)
        deadline = started + entry["budget_seconds"] - 25
        status = None
        try:
            while time.monotonic() < deadline:
                if service.process.poll() is not None:
                    entry["ended"] = process_end(service.process)
                    how = entry["ended"]["signal"] or f"exit {entry['ended']['exit']}"
                    raise PhaseStop(
                        "failed",
                        f"failsoft serve died ({how}) {time.monotonic() - started:.1f} s after its start:\n"
                        f"{tail(service.output(), 30)}",
                    )
                status = service_status(service.base_url)
                if workers_ready(status):
                    break
                time.sleep(0.3)
            else:
                raise PhaseStop(
                    "failed", f"the workers were not ready in time:\n{tail(service.output(), 30)}"
                )
            entry["ready_after_seconds"] = round(time.monotonic() - started, 2)
            entry["chat"] = asyncio.run(asyncio.wait_for(_smoke_chat(service), timeout=20))
            if entry["chat"].get("worker") != "gpu" and entry["chat"].get("device") != "gpu":
                raise PhaseStop(
                    "failed",
                    f"the chat was not answered on the GPU: {entry['chat'].get('worker')} "
                    f"({entry['chat'].get('client_error')})",
                )
        except BaseException:
            stop_process_tree(service.process)  # no service to go on with
            raise
        finally:
            entry["serve_output_tail"] = tail(service.output(), 60)
        return service


def phase_service(report: Report, service: ServeProcess, root: Path) -> dict[str, Any]:
    """The running service: `failsoft doctor --json` beside it, its status, where each worker runs."""
    with report.phase("service") as entry:
        config_path = root / "config.toml"
        try:
            doctor = subprocess.run(
                [sys.executable, "-m", "tray_app", "doctor", "--json"],
                capture_output=True,
                text=True,
                timeout=entry["budget_seconds"] - 30,
                env=service_env(root, config_path),
            )
        except subprocess.TimeoutExpired:
            entry["doctor"] = {"timed_out": entry["budget_seconds"] - 30}
            report.problem("failsoft doctor --json did not answer in time")
        else:
            try:
                entry["doctor"] = json.loads(doctor.stdout)
            except ValueError:
                output = tail(doctor.stdout + doctor.stderr, 20)
                entry["doctor"] = {"exit": doctor.returncode, "output": output}
        status = service_status(service.base_url)
        if not workers_ready(status):
            raise PhaseStop("failed", f"the workers are not ready:\n{tail(service.output(), 30)}")
        assert status is not None
        entry["url"] = service.base_url
        entry["failsoft_status"] = status_view(status)
        runs_on = entry["failsoft_status"]["workers"]["gpu"].get("runs_on") or ""
        if "CUDA" not in runs_on:
            report.problem(f"the GPU worker runs on {runs_on!r}, not on a CUDA device")
        return status


def worker_log(root: Path, role: str) -> str:
    path = root / "logs" / f"{role}-worker.log"
    return path.read_text(errors="replace") if path.exists() else ""


def phase_planner(report: Report, status: dict[str, Any], root: Path) -> None:
    with report.phase("planner") as entry:
        plan = status.get("plan") or {}
        printed = per_backend(last_load(worker_log(root, "gpu")))
        gpu_pid = ((status.get("workers") or {}).get("gpu") or {}).get("pid")
        cpu_pid = ((status.get("workers") or {}).get("cpu") or {}).get("pid")
        reading = nvml_memory(0)
        processes = [{"pid": p.pid, "name": p.name, "used_bytes": p.used_bytes} for p in reading.processes]
        measured = next((p.used_bytes for p in reading.processes if p.pid == gpu_pid), None)
        entry["nvml"] = {
            "total_bytes": reading.total_bytes,
            "free_bytes": reading.free_bytes,
            "processes": processes,
            "gpu_worker_pid": gpu_pid,
            "cpu_worker_pid": cpu_pid,
            "reading": reading.reason,
        }
        if measured is None:
            entry["nvml"]["note"] = (
                "NVML listed no process with the GPU worker's pid (another pid namespace?)"
            )
        if cpu_pid is not None and any(p.pid == cpu_pid for p in reading.processes):
            entry["cpu_worker_on_gpu"] = (
                "the CPU worker holds GPU memory: it runs the same CUDA build with every device visible "
                "(a CUDA context, and large batches offloaded to the GPU)"
            )
        entry["printed"] = printed
        entry["compare"] = compare_buffers(plan, printed, measured)
        entry["compute_source"] = plan.get("compute_source")
        for name in entry["compare"]["outside_tolerance"]:
            row = entry["compare"]["buffers"][name]
            report.problem(
                f"planner {name}: predicted {row['predicted_bytes'] / MIB:.2f} MiB, llama.cpp printed "
                f"{row['printed_bytes'] / MIB:.2f} MiB (tolerance {row['tolerance']:.0%})"
            )


# ------------------------------------------------------------------------------------------ pressure
def fill_device(torch: Any, device: Any, smallest: int = 512 * 1024) -> tuple[list[Any], dict[str, Any]]:
    """Allocate with torch until a CUDA allocation fails, in blocks from 1 GiB down to `smallest`: the device
    is then full to within less than that (plain cudaMalloc through torch's allocator, no managed memory)."""
    blocks: list[Any] = []
    size = 1024 * MIB
    failures = 0
    first_failure = ""
    started = time.monotonic()
    while size >= smallest:
        try:
            blocks.append(torch.empty(size, dtype=torch.uint8, device=device))
        except torch.cuda.OutOfMemoryError as error:
            failures += 1
            first_failure = first_failure or str(error).splitlines()[0]
            size //= 4
    free, total = torch.cuda.mem_get_info(device)
    return blocks, {
        "blocks": len(blocks),
        "taken_bytes": sum(int(block.numel()) for block in blocks),
        "allocation_failures": failures,
        "first_failure": first_failure,
        "free_after_bytes": int(free),
        "total_bytes": int(total),
        "seconds": round(time.monotonic() - started, 2),
    }


async def _job(client: ServiceClient, words: int, salt: int) -> dict[str, Any]:
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": prompt_words(words, salt)}],
        "max_tokens": 8,
        "temperature": 0,
        "seed": 1,
    }
    answer = await client.chat(body)
    summary: dict[str, Any] = {
        "prompt_words": words,
        "http_status": answer.status,
        "seconds": round(answer.ended_at - answer.started_at, 2),
        "answers_to_client": answer.answers_seen(),
        "client_error": answer.error or answer.transport_error or None,
        "failsoft": answer.failsoft,
    }
    if answer.job_id:
        record = await client.wait_job_final(answer.job_id, timeout=120)
        keys = ("id", "state", "worker", "attempts", "fallback_reason", "attempt_log", "error")
        summary.update({key: record.get(key) for key in keys})
    return summary


def job_sizes(n_ctx_per_seq: int) -> list[int]:
    """Prompt sizes, growing: each needs more scratch memory in the worker than the one before (the largest
    stays well inside one GPU slot, so the router never sends it to the CPU at admission)."""
    largest = max(64, int(n_ctx_per_seq * 0.6))
    return sorted({size for size in (48, 160, 400, 1000, largest) if size <= largest})


async def _pressure(report: Report, entry: dict[str, Any], service: ServeProcess, root: Path) -> None:
    try:
        import torch
    except ImportError as error:
        entry["status"] = "skipped"
        entry["message"] = f"torch is not installed ({error}): the pressure step cannot run"
        report.problem(entry["message"])
        return
    if not torch.cuda.is_available():
        entry["status"] = "skipped"
        entry["message"] = "torch sees no CUDA device: the pressure step cannot run"
        report.problem(entry["message"])
        return
    entry["torch"] = torch.__version__
    client = ServiceClient(service.base_url)
    try:
        status = await client.wait_ready(timeout=60)
        cap = int((status.get("caps") or {}).get("n_ctx_per_seq") or 512)
        entry["baseline"] = await _job(client, 24, 0)
        if entry["baseline"].get("worker") != "gpu":
            report.problem(f"a small request before the pressure ran on {entry['baseline'].get('worker')}")
        device = torch.device("cuda:0")
        entry["nvml_free_before_bytes"] = nvml_memory(0).free_bytes
        blocks, entry["fill"] = fill_device(torch, device)
        entry["nvml_free_during_bytes"] = nvml_memory(0).free_bytes
        taken, left = entry["fill"]["taken_bytes"] / MIB, entry["fill"]["free_after_bytes"] / MIB
        say(f"pressure: took {taken:.0f} MiB, {left:.1f} MiB free")
        jobs: list[dict[str, Any]] = []
        try:
            for salt, words in enumerate(job_sizes(cap), start=1):
                if time.monotonic() > entry["_deadline"] - 60:
                    entry["cut_short"] = "the phase's time ran low"
                    break
                job = await _job(client, words, salt)
                jobs.append(job)
                say(f"pressure: {words} words -> {job.get('worker')} in {job.get('attempts')} attempt(s)")
                if any(a.get("outcome") == "failed" for a in job.get("attempt_log") or []):
                    break
        finally:
            del blocks
            torch.cuda.empty_cache()
        entry["jobs"] = jobs
        entry["failover"] = judge_failover(jobs, worker_log(root, "gpu"))
        for problem in entry["failover"]["problems"]:
            report.problem(f"failover: {problem}")
        try:
            left = entry["_deadline"] - time.monotonic() - 15
            after = await client.wait_ready(timeout=max(10.0, min(60.0, left)))
            entry["recovered"] = status_view(after)["workers"]
        except Exception as error:  # the report says it; the check goes on to stop the service
            entry["recovered"] = None
            report.problem(f"the workers were not both ready again after the memory was released: {error}")
    finally:
        await client.aclose()


def phase_pressure(report: Report, service: ServeProcess, root: Path) -> None:
    with report.phase("pressure") as entry:
        entry["_deadline"] = time.monotonic() + entry["budget_seconds"]
        try:
            asyncio.run(
                asyncio.wait_for(_pressure(report, entry, service, root), timeout=entry["budget_seconds"])
            )
        finally:
            entry.pop("_deadline", None)


def phase_teardown(report: Report, service: ServeProcess | None, root: Path) -> None:
    with report.phase("teardown") as entry:
        if service is not None:
            entry["ended_before_stop"] = process_end(service.process)
            stop_process_tree(service.process)
            entry["gpu_worker_log_tail"] = tail(worker_log(root, "gpu"), 40)
            entry["service_log_tail"] = tail(service.output(), 20)


def service_phases(report_path: Path, deadline: float, model: Path, state: Path) -> int:
    """SERVICE_PHASES in order: after `smoke` or `service` fails there is no service to go on with; after
    any other, the next one runs (each has its own budget), until the total limit is spent."""
    report = Report.load(report_path, deadline)
    root = state / "service"
    report.add_log_dirs(root, root / "logs", state / "moe" / "logs")
    service: ServeProcess | None = None
    try:
        service = phase_smoke(report, model, root)
        status = phase_service(report, service, root)
        for phase in (
            lambda: phase_planner(report, status, root),
            lambda: phase_watcher(report, service),
            lambda: phase_moe(report, state),
            lambda: phase_pressure(report, service, root),
            lambda: phase_bench(report, service),
        ):
            try:
                phase()
            except PhaseStop as stop:
                if stop.status == "out_of_time":
                    break
    except PhaseStop:
        pass
    finally:
        with contextlib.suppress(PhaseStop):
            phase_teardown(report, service, root)
    report.write()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the GPU check's service phases (run by gpu_check.py)")
    parser.add_argument("--report", type=Path, required=True, help="the report the check started")
    parser.add_argument("--deadline", type=float, required=True, help="time.time() by which all must end")
    parser.add_argument("--model", type=Path, required=True, help="the model file to serve")
    parser.add_argument("--state", type=Path, required=True, help="where the check builds and runs")
    args = parser.parse_args(argv)
    return service_phases(args.report, args.deadline, args.model, args.state)


if __name__ == "__main__":
    sys.exit(main())
