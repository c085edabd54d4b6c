"""`failsoft serve`: the service headless (supervisor, workers, router) until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import ipaddress
import logging

import uvicorn

from tray_app.cli import load_config
from tray_app.config import Config, ConfigError
from tray_app.host import event_loop
from tray_app.host.service import Service
from tray_app.server.app import create_app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(cfg: Config) -> None:
    """Nothing listens beyond loopback unless the user asked for it and set an API key."""
    if not is_loopback(cfg.server.host) and not cfg.server.api_key:
        raise ConfigError(
            f"{cfg.source}: refusing to listen on {cfg.server.host} without server.api_key; "
            "set an API key in the config, or bind 127.0.0.1"
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
    cfg = load_config(args)
    check_bind(cfg)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health probe otherwise
    service = Service(cfg, enable_faults=bool(getattr(args, "enable_faults", False)))
    plan = service.plan_set
    label = " (simulated)" if plan.device.simulated else ""
    print(
        f"failsoft serve: model {service.model_id}; GPU{label} n_ctx {plan.gpu.n_ctx} "
        f"({plan.gpu.n_ctx_per_seq} per sequence, {plan.gpu.n_parallel} parallel); "
        f"CPU n_ctx {plan.cpu.n_ctx}",
        flush=True,
    )
    print(f"failsoft serve: listening on http://{cfg.server.host}:{cfg.server.port}", flush=True)
    server = uvicorn.Server(uvicorn_config(create_app(service), cfg.server.host, cfg.server.port))
    event_loop.run(server.serve())
    return 0 if server.started else 1
