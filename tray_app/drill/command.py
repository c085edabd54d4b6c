"""`failsoft drill`: run the scenarios (and optionally memory pressure) against a service with faults enabled,
print the table, write JSON and Markdown reports into the data directory, and exit non-zero if any scenario
lost a job, answered twice, repeated a tool or got an unexpected decision. `--soak MINUTES` runs the chaos
mix instead (soak_command)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from tray_app import paths
from tray_app.config import Config, load_config
from tray_app.contract.sizes import parse_size
from tray_app.contract.status import ServiceStatus
from tray_app.drill.client import DrillError, EventLog, ServiceClient
from tray_app.drill.context import DrillContext
from tray_app.drill.expected import TITLES
from tray_app.drill.launcher import LaunchError, drill_config, launched_service, long_slot_config
from tray_app.drill.peer_pair import PeerSide, launched_pair
from tray_app.drill.pressure import apply_pressure
from tray_app.drill.records import ScenarioRecord
from tray_app.drill.registry import LONG_SLOT_SCENARIOS, PEER_SCENARIOS, RPC_SCENARIOS, SCENARIOS
from tray_app.drill.report import DrillReport, text, write
from tray_app.drill.rpc_launch import RpcBox, box_config, launched_box
from tray_app.drill.service_check import Progress, checked_status, default_simulated_vram, service_summary
from tray_app.drill.soak import soak_minutes
from tray_app.engine import binary
from tray_app.engine.rpc_command import rpc_server_path
from tray_app.host.launch import ServeProcess

SPEED_WAIT = 90.0  # the service measures the CPU worker's speed once it is ready; the policy needs it


def selected_scenarios(requested: list[str] | None, *, pressure: bool) -> list[str]:
    """The scenario keys to run, in order: all (a to o) by default, none with --pressure alone; "h,i,j"
    works too."""
    if not requested:
        return [] if pressure else list(SCENARIOS)
    keys = [key.strip().lower() for item in requested for key in item.split(",") if key.strip()]
    unknown = [key for key in keys if key not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario {', '.join(unknown)}; scenarios are {', '.join(SCENARIOS)}")
    return [key for key in SCENARIOS if key in keys]


async def _measured_status(client: ServiceClient) -> ServiceStatus:
    """/failsoft/status once the service knows the CPU worker's speed (its replay decisions depend on it)."""

    async def measured() -> ServiceStatus | None:
        status = await client.status()
        return status if float(status["policy"].get("cpu_tokens_per_second") or 0) > 0 else None

    result: ServiceStatus = await client.wait_for(
        measured, "the CPU worker's measured speed", SPEED_WAIT, 0.2
    )
    return result


async def _play(ctx: DrillContext, key: str) -> ScenarioRecord:
    await ctx.refresh()
    try:
        return await SCENARIOS[key](ctx)
    except DrillError as error:
        record = ScenarioRecord(key, TITLES[key], False, actual="the drill could not finish", lost=0)
        record.notes.append(f"drill error: {error}")
        return record


async def drill(
    url: str,
    keys: list[str],
    pressure: int | None,
    *,
    launched: bool,
    progress: Progress,
    api_key: str = "",
    stand_in_enabled: bool = True,
    max_loaded: int | None = None,
    admin: str = "",
    peer: PeerSide | None = None,
    box: RpcBox | None = None,
) -> DrillReport:
    """`peer`: the service's peer the drill started beside it (scenarios m and n), if any; `box`: the RPC
    box its GPU worker spans (scenario o), if any."""
    client = ServiceClient(url, api_key, admin=admin)
    events = EventLog(client)
    started = time.time()
    try:
        await checked_status(client)
        await client.wait_ready()
        await events.start()
        status = await _measured_status(client)
        report = DrillReport(started, service_summary(url, status, launched))
        if pressure is not None:
            progress(f"memory pressure: taking {pressure} bytes")
            report.pressure = await apply_pressure(client, pressure)
        ctx = DrillContext(client, events, status, stand_in_enabled, max_loaded, peer=peer, box=box)
        for key in keys:
            progress(f"scenario {key}: {TITLES[key]}")
            report.scenarios.append(await _play(ctx, key))
        await client.wait_ready()  # leave the service as it was found: both workers up
    finally:
        await events.stop()
        await client.aclose()
    report.seconds = time.time() - started
    report.judge()
    return report


def _run_drill(
    args: argparse.Namespace, keys: list[str], pressure: int | None, progress: Progress
) -> DrillReport:
    cfg = load_config(args)
    if args.url:
        return _drill_at(args, cfg, keys, pressure, progress)
    settings = drill_config(cfg, args.simulate_vram or default_simulated_vram(cfg))
    own = [key for key in keys if key in LONG_SLOT_SCENARIOS]
    paired = [key for key in keys if key in PEER_SCENARIOS]
    boxed = [key for key in keys if key in RPC_SCENARIOS]
    missing = rpc_server_missing(cfg) if boxed else None
    if missing is not None:  # played on the shared service without a box: it says why it is skipped
        progress(f"scenario {', '.join(boxed)} without an RPC box: {missing}")
        boxed = []
    shared = [key for key in keys if key not in own and key not in paired and key not in boxed]
    reports: list[DrillReport] = []
    if shared or pressure is not None or not (own or paired or boxed):
        progress("starting `failsoft serve --enable-faults` for the drill (stopped at the end)")
        with launched_service(settings) as service:
            reports.append(_drill_on(service, settings, shared, pressure, progress))
    if own:
        # The drill's short GPU slots keep a-j quick; a long conversation needs slots of its own.
        progress(f"starting a service with longer GPU slots for scenario {', '.join(own)}")
        with launched_service(long_slot_config(settings)) as service:
            reports.append(_drill_on(service, settings, own, None, progress))
    if paired:
        # A peer must be another service, one the drill may stop and kill: two of their own.
        progress(f"starting a service and its peer (its [[peers]]) for scenario {', '.join(paired)}")
        with launched_pair(settings) as (service, peer):
            reports.append(_drill_on(service, settings, paired, None, progress, peer))
    if boxed:
        # A box the drill may kill, and a service planned with it from its start: both of their own.
        progress(
            f"starting an RPC box and a service whose GPU worker spans it for scenario {', '.join(boxed)}"
        )
        with launched_box(settings) as box, launched_service(box_config(settings, box.endpoint)) as service:
            reports.append(_drill_on(service, settings, boxed, None, progress, box=box))
    return _merged(reports)


def _drill_at(
    args: argparse.Namespace, cfg: Config, keys: list[str], pressure: int | None, progress: Progress
) -> DrillReport:
    """The drill against the service at --url. A service on this machine is usually the configured one: its
    API key (if any) is the config's, and so are its library settings, which its status does not show."""
    return asyncio.run(
        drill(
            args.url,
            keys,
            pressure,
            launched=False,
            progress=progress,
            api_key=cfg.server.api_key,
            stand_in_enabled=cfg.library.stand_in == "auto",
            max_loaded=cfg.library.max_loaded,
            admin=getattr(args, "admin_token", None) or "",  # elsewhere than here: named by the user
        )
    )


def rpc_server_missing(cfg: Config) -> str | None:
    """Why the engine has no rpc-server beside it (a build of one's own, without llama.cpp's RPC), or None."""
    try:
        rpc_server_path(binary.locate(cfg.engine.llama_server))
    except binary.EngineError as error:
        return str(error)
    return None


def _merged(reports: list[DrillReport]) -> DrillReport:
    """One report of the drills played on the services it started, in the order they ran."""
    report, *others = reports
    for extra in others:
        report.scenarios += extra.scenarios
        report.seconds += extra.seconds
    report.judge()
    return report


def _drill_on(
    service: ServeProcess,
    settings: dict[str, Any],
    keys: list[str],
    pressure: int | None,
    progress: Progress,
    peer: PeerSide | None = None,
    box: RpcBox | None = None,
) -> DrillReport:
    return asyncio.run(
        drill(
            service.base_url,
            keys,
            pressure,
            admin=service.admin_token,
            launched=True,
            progress=progress,
            stand_in_enabled=settings["library"]["stand_in"] == "auto",
            max_loaded=int(settings["library"]["max_loaded"]),
            peer=peer,
            box=box,
        )
    )


def run(args: argparse.Namespace) -> int:
    def progress(message: str) -> None:
        print(f"failsoft drill: {message}", file=sys.stderr, flush=True)

    try:
        minutes = soak_minutes(args)
        keys = selected_scenarios(args.scenario, pressure=bool(args.pressure))
        pressure = parse_size(args.pressure) if args.pressure else None
    except ValueError as error:
        print(f"failsoft drill: {error}", file=sys.stderr)
        return 2
    try:
        if minutes is not None:
            from tray_app.drill.soak_command import run_soak  # it builds on this module

            return run_soak(args, minutes, progress)
        report = _run_drill(args, keys, pressure, progress)
    except (DrillError, LaunchError) as error:
        print(f"failsoft drill: {error}", file=sys.stderr)
        return 2
    json_path, md_path = write(report, paths.data_dir() / "reports")
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(text(report))
        print(f"\nreports: {json_path}\n         {md_path}")
    for record in report.failed:
        print(f"failsoft drill: scenario {record.key} FAILED: {'; '.join(record.problems)}", file=sys.stderr)
    if report.failed:
        return 1
    return 2 if report.pressure and report.pressure.get("error") else 0
