"""`failsoft bench`: start a service with faults enabled and measure, in one run, the router's overhead, the
failover's overhead, the placements side by side and the planner's accuracy; print ratios (`--json`: JSON)
and keep the JSON in the data directory's reports."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tray_app import paths
from tray_app.bench.against import against_figures, failsoft_target, other_target
from tray_app.bench.byte_proxy import byte_proxy
from tray_app.bench.measure import failover_figures, planner_figures, profile_figures
from tray_app.bench.mirror import mirror_figures
from tray_app.bench.mirror_report import mirror_lines
from tray_app.bench.overhead import measure_overhead
from tray_app.bench.peer import peer_figures
from tray_app.bench.peer_report import peer_lines
from tray_app.bench.report import against_lines, text
from tray_app.bench.split import split_profile, split_worker
from tray_app.bench.start_time import start_figures, start_lines
from tray_app.bench.throughput import LEVELS as THROUGHPUT_LEVELS
from tray_app.bench.throughput import throughput_figures
from tray_app.config import Config, load_config
from tray_app.contract.status import ServiceStatus
from tray_app.device.cost import watcher_cost_figures
from tray_app.drill.client import DrillError, ServiceClient
from tray_app.drill.launcher import (
    DRILL_SUPERVISOR,
    LONG_HEALTH_TIMEOUT,
    LaunchError,
    drill_config,
    launched_service,
    long_slot_config,
)
from tray_app.drill.service_check import default_simulated_vram, service_summary
from tray_app.engine import binary

PROFILE_TOKENS = 32
Progress = Callable[[str], None]


def bench_config(cfg: Config, simulate_vram: str | None) -> dict[str, Any]:
    """The user's config (their context and cache settings: the profiles they run), on loopback, with fast
    failure detection and automatic fallback so the failover can be measured."""
    data = cfg.to_dict()
    if simulate_vram:
        data["device"]["simulate_vram"] = simulate_vram
    data["cpu"].update(enabled=True, warm=True)
    data["server"].update(host="127.0.0.1", api_key="")
    data["failover"].update(fallback="auto", deadline=600.0)
    data["supervisor"].update(DRILL_SUPERVISOR)
    return data


OVERHEAD_TOKENS = 8
START_CONTEXT = 4096  # llama-server alone starts with this context: the service's GPU worker's order of size


def one_token_rounds(rounds: int) -> int:
    """Rounds for the one-token measurements: five times the overhead's. A round takes a few tens of
    milliseconds, and a fixed cost of about a millisecond in a machine's noise needs hundreds of pairs
    for its interval to narrow to a few tenths."""
    return rounds * 5


def sub_rounds(rounds: int) -> int:
    """Rounds for the slower measurements (profiles, failovers): a sixth of the overhead's, at least 2."""
    return max(rounds // 6, 2)


def worker_url(status: ServiceStatus, role: str) -> str:
    """Where the `role` worker listens; an error naming its state when it listens nowhere right now."""
    worker = status["workers"].get(role, {})
    url = worker.get("base_url")
    if not url:
        raise DrillError(f"the {role} worker has no address to measure: it is {worker.get('state')}")
    return url


async def _ready_status(url: str, key: str, admin: str) -> ServiceStatus:
    client = ServiceClient(url, api_key=key, admin=admin)
    try:
        return await client.wait_ready()
    finally:
        await client.aclose()


async def _profiles(url: str, status: ServiceStatus, rounds: int, key: str, admin: str) -> dict[str, Any]:
    workers = status["workers"]
    client = ServiceClient(url, api_key=key, admin=admin)
    try:
        figures: dict[str, Any] = {}
        if status.get("simulated"):
            figures["cpu"] = await profile_figures(
                client.http, worker_url(status, "cpu"), rounds, PROFILE_TOKENS
            )
            figures["gpu_simulated"] = await profile_figures(
                client.http, worker_url(status, "gpu"), rounds, PROFILE_TOKENS
            )
            note = (
                "the simulated GPU worker runs the same CPU build: the profiles differ only in their budget"
            )
            return {"rounds": rounds, "max_tokens": PROFILE_TOKENS, "workers": figures, "note": note}
        figures["gpu_resident"] = await profile_figures(
            client.http, worker_url(status, "gpu"), rounds, PROFILE_TOKENS
        )
        log_path = paths.log_dir() / "bench-split-worker.log"
        profile = split_profile(workers["gpu"]["profile"])
        with split_worker(profile, log_path) as split_url:
            figures["planned_split"] = await profile_figures(client.http, split_url, rounds, PROFILE_TOKENS)
        figures["cpu_fallback"] = await profile_figures(
            client.http, worker_url(status, "cpu"), rounds, PROFILE_TOKENS
        )
        note = f"split: {profile.n_gpu_layers} of {status['plan'].get('n_layers')} layers on the GPU"
        return {"rounds": rounds, "max_tokens": PROFILE_TOKENS, "workers": figures, "note": note}
    finally:
        await client.aclose()


async def _failover(url: str, rounds: int, key: str, admin: str) -> dict[str, Any]:
    client = ServiceClient(url, api_key=key, admin=admin)
    try:
        return await failover_figures(client, rounds)
    finally:
        await client.aclose()


def bench(
    url: str,
    rounds: int,
    progress: Progress,
    router_pid: int | None = None,
    worker_key: str = "",
    clients: tuple[int, ...] = THROUGHPUT_LEVELS,
    tokens: int = 64,
    admin: str = "",
) -> dict[str, Any]:
    """`worker_key`: the key the service's workers take (a bench launches the service with one it knows);
    sent on every request, it lets the bench ask the workers directly. The router here has no key of its
    own, so it ignores it. `admin`: the launched service's control token (its drill faults need it)."""
    started = time.time()
    status = asyncio.run(_ready_status(url, worker_key, admin))
    headers = {"Authorization": f"Bearer {worker_key}"} if worker_key else None
    results: dict[str, Any] = {
        "started_at": started,
        "rounds": rounds,
        "service": service_summary(url, status, True),
    }
    results["planner_accuracy"] = planner_figures(status)
    gpu_url = worker_url(status, "gpu")
    results.update(_router_overheads(url, gpu_url, rounds, headers, router_pid, progress))
    levels = ", ".join(str(level) for level in clients)
    progress(f"throughput with {levels} concurrent clients, router vs direct")
    results["throughput"] = asyncio.run(
        throughput_figures(
            url, gpu_url, headers or {}, levels=clients, rounds=sub_rounds(rounds), max_tokens=tokens
        )
    )
    progress(f"profiles ({sub_rounds(rounds)} rounds)")
    results["profiles"] = asyncio.run(_profiles(url, status, sub_rounds(rounds), worker_key, admin))
    progress(f"failover overhead ({sub_rounds(rounds)} rounds)")
    results["failover_overhead"] = asyncio.run(_failover(url, sub_rounds(rounds), worker_key, admin))
    progress("the device watcher's CPU per poll")
    results["device_watcher"] = watcher_cost_figures()
    results["seconds"] = round(time.time() - started, 1)
    return results


def _router_overheads(
    url: str,
    gpu_url: str,
    rounds: int,
    headers: dict[str, str] | None,
    router_pid: int | None,
    progress: Progress,
) -> dict[str, Any]:
    """What the router adds, direct to the GPU worker vs through the router (`url`). One token first: the
    router's fixed cost per request, with no generation time around it to add noise, beside a byte-for-byte
    proxy's (the floor of any extra hop); then a short answer for the per-chunk cost."""
    short = one_token_rounds(rounds)
    progress(f"router overhead, 1 token ({short} rounds)")
    fixed_cost = measure_overhead(
        url, gpu_url, rounds=short, max_tokens=1, headers=headers, router_pid=router_pid, own_time=True
    )
    progress(f"a byte-for-byte proxy's overhead, 1 token ({short} rounds): the floor of any extra hop")
    with byte_proxy(int(gpu_url.rsplit(":", 1)[1])) as proxy_url:
        proxy = measure_overhead(proxy_url, gpu_url, rounds=short, max_tokens=1, headers=headers)
    progress(f"router overhead, {OVERHEAD_TOKENS} tokens ({rounds} rounds)")
    overhead = measure_overhead(
        url,
        gpu_url,
        rounds=rounds,
        max_tokens=OVERHEAD_TOKENS,
        headers=headers,
        router_pid=router_pid,
        own_time=True,
    )
    return {"router_fixed_cost": fixed_cost, "byte_proxy": proxy, "router_overhead": overhead}


def _clients(args: argparse.Namespace) -> tuple[int, ...]:
    """The client counts of --clients; () when the arguments are wrong (said on stderr)."""
    if args.rounds < 1 or args.tokens < 1:
        print("failsoft bench: --rounds and --tokens must be at least 1", file=sys.stderr)
        return ()
    try:
        clients = tuple(int(part) for part in args.clients.split(","))
    except ValueError:
        clients = ()
    if not clients or min(clients) < 1:
        print("failsoft bench: --clients takes whole numbers >= 1, e.g. 1,4,8", file=sys.stderr)
        return ()
    return clients


def run(args: argparse.Namespace) -> int:
    def progress(message: str) -> None:
        print(f"failsoft bench: {message}", file=sys.stderr, flush=True)

    clients = _clients(args)
    if not clients:
        return 2
    cfg = load_config(args)
    if args.against:
        return _against(args, cfg, clients, progress)
    if args.url:
        print(
            "failsoft bench: --url goes with --against (the full bench starts its own service)",
            file=sys.stderr,
        )
        return 2
    if args.peer:
        return _peer_only(args, cfg, progress)
    settings = bench_config(cfg, args.simulate_vram or default_simulated_vram(cfg))
    if args.start:
        return _start_only(args, settings, cfg.model_path(), progress)
    if args.mirror:
        # A simulated GPU reads a long prompt at CPU speed: on a busy machine its first token can come after
        # the fast drill's deadline (15 s + 1 s per 100 tokens). The kill is what is measured, not a hang.
        settings["supervisor"]["health_timeout"] = LONG_HEALTH_TIMEOUT
    progress("starting `failsoft serve --enable-faults` for the bench (stopped at the end)")
    try:
        with launched_service(settings) as service:
            if args.mirror:
                return _mirror_only(args, service.base_url, progress, service.worker_key, service.admin_token)
            results = bench(
                service.base_url,
                args.rounds,
                progress,
                service.process.pid,
                service.worker_key,
                clients,
                args.tokens,
                admin=service.admin_token,
            )
    except (DrillError, LaunchError, RuntimeError, httpx.HTTPError) as error:
        print(f"failsoft bench: {error}", file=sys.stderr)
        return 2
    _report(args, "bench", results, text(results))
    return 0


def _start_only(args: argparse.Namespace, settings: dict[str, Any], model: Path, progress: Progress) -> int:
    """`--start`: only the start to the first answer, in a fifth of --rounds rounds (4 by default)."""
    started = time.time()
    try:
        figures = start_figures(settings, model, START_CONTEXT, max(args.rounds // 5, 1), progress)
    except (RuntimeError, binary.EngineError, httpx.HTTPError, LaunchError) as error:
        print(f"failsoft bench: {error}", file=sys.stderr)
        return 2
    results = {"started_at": started, "seconds": round(time.time() - started, 1), "start": figures}
    _report(args, "bench-start", results, start_lines(figures))
    return 0


def _mirror_only(args: argparse.Namespace, url: str, progress: Progress, key: str, admin: str) -> int:
    """`--mirror`: only the CPU mirror's figures (failover pause by prompt length, throughput beside it),
    in a sixth of --rounds rounds (3 by default; at least 1). Not in the full bench: its long prompts, read at
    CPU speed beside a simulated GPU, take minutes a round."""
    started = time.time()
    rounds = max(args.rounds // 6, 1)
    figures = asyncio.run(mirror_figures(url, rounds, args.tokens, progress, key, admin))
    results = {"started_at": started, "seconds": round(time.time() - started, 1), "mirror": figures}
    _report(args, "bench-mirror", results, "\n".join(mirror_lines(figures)).strip())
    return 0


def _peer_only(args: argparse.Namespace, cfg: Config, progress: Progress) -> int:
    """`--peer`: only the failover pause by the next rung, a peer's GPU against this machine's CPU, in a
    sixth of --rounds rounds (3 by default; at least 1). On services of its own with the drill's long slots
    (scenario l's): prompts up to 2,000 tokens, each read at CPU speed on a simulated GPU, minutes a round."""
    started = time.time()
    settings = long_slot_config(drill_config(cfg, args.simulate_vram or default_simulated_vram(cfg)))
    try:
        figures = peer_figures(settings, max(args.rounds // 6, 1), progress)
    except (DrillError, LaunchError, RuntimeError, httpx.HTTPError) as error:
        print(f"failsoft bench: {error}", file=sys.stderr)
        return 2
    results = {"started_at": started, "seconds": round(time.time() - started, 1), "peer": figures}
    _report(args, "bench-peer", results, "\n".join(peer_lines(figures)))
    return 0


def _against(args: argparse.Namespace, cfg: Config, clients: tuple[int, ...], progress: Progress) -> int:
    """Only the throughput, Failsoft (running at --url, or started from the user's config as it is) beside
    the server at --against."""
    other = other_target(args.against, args.against_model)
    rounds = sub_rounds(args.rounds)

    def measure(url: str) -> dict[str, Any]:
        levels = ", ".join(str(level) for level in clients)
        progress(
            f"throughput with {levels} concurrent clients, {other.base_url} vs Failsoft ({rounds} rounds)"
        )
        figures = asyncio.run(
            against_figures(
                failsoft_target(url, cfg.server.api_key),
                other,
                levels=clients,
                rounds=rounds,
                max_tokens=args.tokens,
            )
        )
        return {"started_at": started, **figures}

    started = time.time()
    try:
        if args.url:
            results = measure(args.url.rstrip("/"))
        else:
            progress("starting `failsoft serve` from your config for the comparison (stopped at the end)")
            with launched_service(bench_config(cfg, args.simulate_vram)) as service:
                results = measure(service.base_url)
    except httpx.HTTPError as error:
        print(f"failsoft bench: {error.__class__.__name__}: {error} ({error.request.url})", file=sys.stderr)
        return 2
    except (LaunchError, RuntimeError) as error:
        print(f"failsoft bench: {error}", file=sys.stderr)
        return 2
    _report(args, "bench-against", results, "\n".join(against_lines(results)))
    return 0


def _report(args: argparse.Namespace, name: str, results: dict[str, Any], printed: str) -> None:
    """Keep the JSON in the data directory's reports; print it (--json) or the text."""
    reports = paths.data_dir() / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    path = reports / f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(results['started_at']))}.json"
    path.write_text(json.dumps(results, indent=2), encoding="utf-8")
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(printed)
        print(f"\nreport: {path}")
