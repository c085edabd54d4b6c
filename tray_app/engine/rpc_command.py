"""`failsoft rpc serve`: this machine's device for another machine's llama-server, through llama.cpp's own
RPC backend (`rpc-server`, built with the engine: `-DGGML_RPC=ON`).

llama.cpp documents its RPC backend as a proof of concept: no authentication and no encryption. Whoever
reaches the port can run computations on this device and read what it holds. So the server is bound only to
an address the user names, and only to a loopback, private or link-local one: a LAN behind a firewall.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tray_app.config import load_config
from tray_app.config.peers import is_local_address, literal_address
from tray_app.engine import binary

DEFAULT_PORT = 50052  # rpc-server's own default
# llama.cpp's RPC server as the build installs it: `ggml-rpc-server` (ggml's own tool), `rpc-server` in
# older trees.
RPC_SERVERS = ("ggml-rpc-server", "rpc-server")
WARNING = (
    "llama.cpp's RPC server has no authentication and no encryption: anyone who reaches {where} can use "
    "this device and read what it holds. Keep it on a LAN behind a firewall."
)


class RpcRefused(ValueError):
    """The address cannot be served: the message says why and what to name instead."""


def rpc_server_path(llama_server: Path) -> Path:
    """The RPC server built beside `llama-server` (the same llama.cpp commit, the same backend)."""
    for name in RPC_SERVERS:
        path = llama_server.with_name(name)
        if path.is_file():
            return path
    raise binary.EngineError(
        f"no {RPC_SERVERS[0]} beside {llama_server}: rebuild the engine (`failsoft engine build`), which "
        "builds it with llama.cpp's RPC backend"
    )


def checked_host(host: str) -> str:
    """`host` when rpc-server may listen there: a literal loopback, private or link-local address."""
    address = literal_address(host)
    if address is None:
        raise RpcRefused(f"--host {host!r}: name this machine's LAN address as an IP, e.g. 192.168.1.20")
    if address.is_unspecified:
        raise RpcRefused(f"--host {host}: every address would expose the device; name the LAN address")
    if not is_local_address(address):
        raise RpcRefused(f"--host {host}: not a LAN address; the RPC server has no authentication")
    return str(address)


def rpc_argv(server: Path, host: str, port: int, threads: int | None, cache: bool) -> list[str]:
    argv = [str(server), "--host", host, "--port", str(port)]
    if threads:
        argv += ["--threads", str(threads)]
    if cache:
        argv.append("--cache")  # keeps the weights it was sent, so a restarted worker loads them faster
    return argv


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rpc = sub.add_parser(
        "rpc", help="this machine's device for another machine's llama-server (llama.cpp RPC)"
    )
    actions = rpc.add_subparsers(dest="rpc_action", required=True)
    serve = actions.add_parser(
        "serve", help="run llama.cpp's rpc-server on a LAN address (no authentication)"
    )
    serve.add_argument("--host", required=True, help="this machine's LAN address to listen on, as an IP")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    serve.add_argument("--threads", type=int, help="CPU threads (a CPU backend's; llama.cpp's default: 1)")
    serve.add_argument("--cache", action="store_true", help="keep the weights it was sent on local disk")


def run(args: argparse.Namespace) -> int:
    return serve(args)


def serve(args: argparse.Namespace) -> int:
    """Run rpc-server in the foreground (this process becomes it) until it is stopped."""
    try:
        host = checked_host(args.host)
        server = rpc_server_path(binary.locate(load_config(args).engine.llama_server))
    except (RpcRefused, binary.EngineError) as error:
        print(f"failsoft rpc serve: {error}", file=sys.stderr)
        return 2
    where = f"{host}:{args.port}"
    print(WARNING.format(where=where), file=sys.stderr)
    print(f"another machine's llama-server uses this device with --rpc {where}", file=sys.stderr)
    sys.stderr.flush()
    argv = rpc_argv(server, host, args.port, args.threads, args.cache)
    os.execv(argv[0], argv)  # signals and the exit status are rpc-server's own from here
