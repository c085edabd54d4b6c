"""`failsoft drill --soak MINUTES` on a service the drill starts (as `failsoft drill` does) or at `--url`:
each round's lines as it ends, then the summary; a JSON report in the data directory's reports. Exit
status 0 only if every invariant held after every round."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from pathlib import Path

from tray_app import paths
from tray_app.config import load_config
from tray_app.drill.client import ServiceClient
from tray_app.drill.launcher import drill_config, launched_service
from tray_app.drill.service_check import Progress, checked_status, default_simulated_vram
from tray_app.drill.soak import SoakResult, soak
from tray_app.drill.soak_memory import serve_pid_of
from tray_app.host.launch import ServeProcess


async def soak_at(
    url: str,
    minutes: float,
    *,
    api_key: str = "",
    admin: str = "",
    serve_pid: int | None = None,
    quiet: bool = False,
) -> SoakResult:
    client = ServiceClient(url, api_key, admin=admin)
    try:
        status = await checked_status(client)
        pid = serve_pid or serve_pid_of(dict(status))

        def emit(line: str) -> None:
            print(line, file=sys.stderr if quiet else sys.stdout, flush=True)

        return await soak(client, minutes, pid, emit)
    finally:
        await client.aclose()


def write_report(result: SoakResult, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result.to_dict(), indent=2), encoding="utf-8")
    return path


def keep_logs(service: ServeProcess, report: Path) -> Path:
    """The drill's service lives in a temporary directory: its output and worker logs, kept beside the report
    when the soak failed, say why."""
    kept = report.with_suffix("")
    kept.mkdir(parents=True, exist_ok=True)
    shutil.copy2(service.output_path, kept / service.output_path.name)
    logs = service.output_path.parent / "logs"
    if logs.is_dir():
        shutil.copytree(logs, kept / "logs", dirs_exist_ok=True)
    return kept


def run_soak(args: argparse.Namespace, minutes: float, progress: Progress) -> int:
    cfg = load_config(args)
    reports = paths.data_dir() / "reports"
    kept: Path | None = None
    if args.url:
        # The configured service, usually: its API key is the config's, its admin token this user's.
        admin = getattr(args, "admin_token", None) or ""  # another address's token is named by the user
        result = asyncio.run(
            soak_at(args.url, minutes, api_key=cfg.server.api_key, admin=admin, quiet=args.json)
        )
        path = write_report(result, reports)
    else:
        settings = drill_config(cfg, args.simulate_vram or default_simulated_vram(cfg))
        progress(
            f"starting `failsoft serve --enable-faults` for a {minutes:g}-minute soak (stopped at the end)"
        )
        with launched_service(settings) as service:
            result = asyncio.run(
                soak_at(
                    service.base_url,
                    minutes,
                    admin=service.admin_token,
                    serve_pid=service.process.pid,
                    quiet=args.json,
                )
            )
            path = write_report(result, reports)
            kept = None if result.held else keep_logs(service, path)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(
            "\n".join(["", *result.lines(), f"report: {path}", *([f"service logs: {kept}"] if kept else [])])
        )
    return 0 if result.held else 1
