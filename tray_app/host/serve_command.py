"""`failsoft serve`: the service headless (supervisor, workers, router) until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import faulthandler
import ipaddress
import logging
import sys
from urllib.parse import urlsplit

import uvicorn

from tray_app import paths
from tray_app.budget.plan_set import PlanSet
from tray_app.config import Config, ConfigError, load_config
from tray_app.contract.sizes import format_size, parse_size
from tray_app.device.ledger import Ledger, LedgerBusy
from tray_app.host import event_loop
from tray_app.host.bind import listening_socket
from tray_app.host.crash_record import begin_run, enable_crash_stacks
from tray_app.host.service import Service
from tray_app.host.service_probe import TAKEN_PORT_WAIT_S, local_url, probe_service
from tray_app.jobs.journal_owner import JournalInUse
from tray_app.server.routes import create_app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(cfg: Config) -> None:
    """Nothing is reachable beyond loopback unless the user asked for it and set an API key: neither a bind
    beyond loopback, nor a `public_url` beyond it (a reverse proxy forwards whoever reaches it here)."""
    if not is_loopback(cfg.server.host) and not cfg.server.api_key:
        raise ConfigError(
            f"{cfg.source}: refusing to listen on {cfg.server.host} without server.api_key; "
            "set an API key in the config, or bind 127.0.0.1"
        )
    public_host = _url_host(cfg.server.public_url)
    if cfg.server.public_url and not is_loopback(public_host) and not cfg.server.api_key:
        raise ConfigError(
            f"{cfg.source}: refusing to serve server.public_url {cfg.server.public_url} without "
            "server.api_key: whoever reaches that address could use the service; set an API key in the "
            "config, or remove public_url"
        )


def _url_host(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def devices_line(plan: PlanSet, model: str, cpu_enabled: bool) -> str:
    """What serves the model, in one line: the GPU named as the plan sees it (a simulated one says so), or
    that there is none; then the CPU worker."""
    cpu = f"CPU n_ctx {plan.cpu.n_ctx} ({plan.cpu.n_parallel} parallel)" if cpu_enabled else "no CPU worker"
    if not plan.device.available:
        return f"model {model}; no GPU worker ({plan.device.reason or 'no GPU device'}); {cpu}"
    gpu = plan.gpu
    if plan.device.simulated:
        name = f"{plan.device.name} {format_size(plan.device.total_bytes)} [SIMULATED]"  # as bench prints it
    else:
        name = f"GPU {plan.target.label}"
    return (
        f"model {model}; {name}: n_ctx {gpu.n_ctx} ({gpu.n_ctx_per_seq} per sequence, "
        f"{gpu.n_parallel} parallel); {cpu}"
    )


def uvicorn_config(app: object, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        # Nothing stands in front of the router: X-Forwarded-* from a local process must not be believed.
        proxy_headers=False,
    )


def run(args: argparse.Namespace) -> int:
    # First of all: a native crash anywhere below leaves its Python stack in the crash log.
    crash_stacks = enable_crash_stacks(paths.log_dir())
    try:
        return _serve(args)
    finally:
        if crash_stacks is not None:
            faulthandler.disable()
            crash_stacks.close()


def _serve(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    check_bind(cfg)
    host, port = cfg.server.host, cfg.server.port
    try:
        sock = listening_socket(host, port)
    except OSError as error:
        probe = probe_service(local_url(host, port), cfg.server.api_key, wait=TAKEN_PORT_WAIT_S)
        if probe.found == "failsoft":
            print(f"failsoft serve: {probe.detail} is already running", file=sys.stderr)
            return 1
        print(
            f"failsoft serve: cannot listen on {host}:{port}: {error.strerror or error}"
            + (f"; {probe.detail}" if probe.detail else "")
            + "\n  another port: --port or [server] port in the config",
            file=sys.stderr,
        )
        return 1
    with sock:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health probe otherwise
        try:
            if cfg.device.simulate_vram:
                # Claimed here, not first in the service's start-up, where a refusal ends in a traceback.
                Ledger().create(parse_size(cfg.device.simulate_vram))
            service = Service(cfg, enable_faults=bool(getattr(args, "enable_faults", False)))
        except (JournalInUse, LedgerBusy) as error:
            Ledger().remove()  # this run's claim, if it made one; never another process's
            print(f"failsoft serve: {error}", file=sys.stderr)
            return 1
        # The data folder is this run's now (the journal's lock): the marker found is the previous run's.
        service.run = begin_run(paths.data_dir(), paths.log_dir())
        line = devices_line(service.plan_set, service.model_id, cfg.cpu.enabled)
        print(f"failsoft serve: {line}", flush=True)
        print(f"failsoft serve: listening on http://{host}:{port}", flush=True)
        server = uvicorn.Server(uvicorn_config(create_app(service), host, port))
        event_loop.run(server.serve(sockets=[sock]))
    return 0 if server.started else 1
