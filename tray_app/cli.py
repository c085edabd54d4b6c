"""The `failsoft` command: the arguments and the dispatcher, nothing else. Each subcommand lives in its own
module, imported only when it runs, so `failsoft plan` never loads Qt and `failsoft serve` never needs a
display; a command reads its config with `tray_app.config.load_config`, never through this module (which
only `__main__` imports: tests/test_layers.py reads HANDLERS' strings as imports)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tray_app import __version__, config

# subcommand -> "module:function"; the function takes the parsed args and returns an exit status.
HANDLERS = {
    None: "tray_app.ui.app:run",
    "plan": "tray_app.budget.plan_command:run",
    "config": "tray_app.config.command:show_config",
    "serve": "tray_app.host.serve_command:run",
    "drill": "tray_app.drill.command:run",
    "bench": "tray_app.bench.command:run",
    "doctor": "tray_app.doctor.command:run",
    "status": "tray_app.console.command:status",
    "approvals": "tray_app.console.command:approvals",
    "approve": "tray_app.console.command:approve",
    "reject": "tray_app.console.command:reject",
    "load": "tray_app.console.command:load",
    "unload": "tray_app.console.command:unload",
    "worker": "tray_app.console.command:worker",
    "yield": "tray_app.console.command:yield_gpu",
    "resume": "tray_app.console.command:resume_gpu",
    "hog": "tray_app.device.hog:run",
    "engine": "tray_app.engine_build.command:run",
    "rpc": "tray_app.engine.rpc_command:run",
    "models": "tray_app.library.models_command:run",
    "install": "tray_app.install.command:install",
    "uninstall": "tray_app.install.command:uninstall",
}
# Commands that serve the main model: with none to serve, they say what to do instead of starting.
SERVING = (None, "serve")


def _json_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """`--json`: every command that prints a report can print it for a program instead."""
    parser.add_argument("--json", action="store_true", help=what)


def _add_model_and_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", type=Path, help="GGUF model file (default: config, else the bundled SmolLM2)"
    )
    parser.add_argument(
        "--simulate-vram",
        metavar="SIZE",
        help='stand in for a GPU of this size, e.g. "4GiB" (always shown as simulated)',
    )


DESCRIPTION = (
    "Failsoft runs llama.cpp on the GPU with a warm CPU worker behind one OpenAI- and Ollama-compatible "
    "address (http://127.0.0.1:8750 by default). When the GPU fails a request, it replays it on the CPU "
    "where that is safe (once, never repeating a tool action) or asks for your approval when the CPU "
    "would be too slow. Without a subcommand it starts the tray with the service; `failsoft serve` runs "
    "the service without a display."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="failsoft", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"failsoft {__version__}")
    parser.add_argument(
        "--config", type=Path, help="config file (default: the user config dir, or $FAILSOFT_CONFIG)"
    )
    parser.add_argument("--attach", metavar="URL", help="show the tray for a service already running at URL")
    parser.add_argument("--admin-token", metavar="TOKEN", help=ADMIN_TOKEN_HELP)
    _add_model_and_device(parser)
    parser.add_argument("--enable-faults", action="store_true", help="allow fault injection (drills only)")
    sub = parser.add_subparsers(dest="command")
    _add_plan_command(sub)
    _add_config_command(sub)
    _add_serve_command(sub)
    _add_drill_command(sub)
    _add_bench_command(sub)
    _add_doctor_command(sub)
    _add_hog_command(sub)
    _add_console_commands(sub)
    _add_install_commands(sub)
    return parser


def _add_plan_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = sub.add_parser("plan", help="print the VRAM budget split and the caps it leads to")
    plan.add_argument("--model", type=Path, help="GGUF model file")
    vram = plan.add_mutually_exclusive_group()
    vram.add_argument(
        "--vram", metavar="SIZE", help="plan for a GPU of this size instead of the detected one"
    )
    vram.add_argument("--simulate-vram", metavar="SIZE", help="plan for a simulated GPU of this size")
    plan.add_argument("--ctx", type=int, help="context length to plan for (total over all sequences)")
    plan.add_argument("--parallel", type=int, help="parallel sequences")
    plan.add_argument("--reserve", type=float, metavar="PCT", help="VRAM reserve in percent")
    plan.add_argument("--cache-type", choices=["f16", "q8_0", "q4_0"], help="KV cache type")
    plan.add_argument(
        "--flash-attn",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="plan with flash attention, or without it (default: the config's, on)",
    )
    _json_flag(plan, "print one JSON object, sizes in bytes")


def _add_config_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    show = sub.add_parser("config", help="print the effective config")
    _json_flag(show, "as JSON instead of TOML")


def _add_serve_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", help="run the service headless (supervisor, workers, router)")
    _add_model_and_device(serve)
    serve.add_argument("--host", help="address to bind (beyond loopback only with server.api_key set)")
    serve.add_argument("--port", type=int, help="port (default 8750)")
    serve.add_argument(
        "--enable-faults", action="store_true", help="expose POST /failsoft/debug/faults for drills"
    )


def _add_drill_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    drill = sub.add_parser(
        "drill", help="the deliberate memory test: push past the GPU profile, record what happens"
    )
    drill.add_argument("--url", help="a running service started with --enable-faults (default: start one)")
    _add_model_and_device(drill)
    drill.add_argument("--pressure", metavar="SIZE", help="take this much VRAM away from the GPU worker")
    drill.add_argument(
        "--scenario", action="append", help="run only these scenarios (a..o, e.g. h,i,j), repeatable"
    )
    drill.add_argument(
        "--soak",
        type=float,
        metavar="MINUTES",
        help="instead of the scenarios, the chaos mix (every dialect, misbehaving clients, GPU kills and "
        "hangs) in rounds for this long: the invariants after each round, the service's memory growth",
    )
    _json_flag(drill, "print the JSON report")


# `failsoft bench --PART`: only that part of the bench, instead of the whole.
BENCH_PARTS = {
    "--mirror": "only the CPU mirror's figures: the failover pause by prompt length with and without it, and "
    "the GPU worker's throughput beside its work (a sixth of --rounds rounds: 3 by default)",
    "--peer": "only the failover pause when the next rung is a peer's GPU ([[peers]], here a second service) "
    "against this machine's CPU, by prompt length (a sixth of --rounds rounds: 3 by default)",
    "--start": "only the start: seconds from `failsoft serve` to its first answer (a new data folder, then "
    "the same again), beside llama-server alone on the model (a fifth of --rounds rounds: 4 by default)",
}


def _add_bench_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser(
        "bench", help="router overhead, throughput, failover overhead, profiles and planner accuracy"
    )
    _add_model_and_device(bench)
    bench.add_argument(
        "--rounds",
        type=int,
        default=20,
        help="requests per measurement (the one-token measurements take five times as many)",
    )
    bench.add_argument(
        "--clients", default="1,4,8", help="concurrent clients for the throughput figures (default 1,4,8)"
    )
    bench.add_argument(
        "--tokens", type=int, default=64, help="tokens per answer in the throughput figures (default 64)"
    )
    bench.add_argument(
        "--against",
        metavar="URL",
        help="only the throughput, beside another OpenAI-compatible server at URL (Ollama, LM Studio, ...)",
    )
    bench.add_argument(
        "--against-model", default="default", metavar="NAME", help="the model to ask the other server for"
    )
    bench.add_argument(
        "--url",
        help="with --against: a Failsoft service already running (default: start one from the config)",
    )
    for flag, what in BENCH_PARTS.items():
        bench.add_argument(flag, action="store_true", help=what)
    _json_flag(bench, "print JSON")


def _add_doctor_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = sub.add_parser(
        "doctor", help="check GPU, engine build, model, port and tray; say what is missing and how to fix it"
    )
    doctor.add_argument("--port", type=int, help="the port to check (default: the config's)")
    _json_flag(doctor, "print one JSON object")


def _add_hog_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    hog = sub.add_parser(
        "hog", help="take memory from a running simulated GPU as another program would, until stopped"
    )
    hog.add_argument("size", metavar="SIZE", help='how much to take, e.g. "3GiB"')
    hog.add_argument("--name", required=True, help="who holds it, as the watcher shows it (e.g. comfyui)")
    hog.add_argument("--hold", type=float, metavar="SECONDS", help="give it back after this long")


def _add_install_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The engine and its RPC server, the models already on this machine, install and uninstall (their
    modules define their arguments)."""
    from tray_app.engine import rpc_command
    from tray_app.engine_build import command as engine_command
    from tray_app.install import command as install_command
    from tray_app.library import models_command

    engine_command.add_parser(sub)
    rpc_command.add_parser(sub)
    models_command.add_parser(sub)
    install_command.add_parsers(sub)


SERVICE_URL_HELP = "the service's address (default: the config's); its key: $FAILSOFT_API_KEY or the config"
ADMIN_TOKEN_HELP = (
    "the admin token of a service at another address (--url, --attach); the one found on this machine "
    "($FAILSOFT_ADMIN_TOKEN, the data folder) goes only to the local service at the config's address"
)


def _add_console_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands that ask a running service (the tray's view and approvals, for a terminal)."""

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=summary)
        parser.add_argument("--url", help=SERVICE_URL_HELP)
        # SUPPRESS: `failsoft --admin-token T status` works too (a default here would overwrite it).
        parser.add_argument(
            "--admin-token", metavar="TOKEN", help=ADMIN_TOKEN_HELP, default=argparse.SUPPRESS
        )
        return parser

    status = command("status", "what a running service is doing: GPU, budget, workers, models, jobs")
    _json_flag(status, "print /failsoft/status as it came")
    approvals = command("approvals", "list the jobs waiting for your approval of a slow CPU run")
    _json_flag(approvals, "print the jobs as JSON")
    approve = command("approve", "let waiting jobs run on the CPU (or on the offered stand-in)")
    approve.add_argument("job_ids", nargs="*", metavar="JOB_ID")
    approve.add_argument("--all", action="store_true", help="approve every job waiting")
    approve.add_argument(
        "--stand-in", action="store_true", help="answer with the smaller model offered on the GPU, now"
    )
    reject = command("reject", "refuse waiting jobs their CPU run (their clients get an error)")
    reject.add_argument("job_ids", nargs="+", metavar="JOB_ID")
    load = command("load", "load a model now (on the GPU when it may and fits, else the CPU)")
    load.add_argument("name", help="the model's name or alias (see `failsoft status`)")
    load.add_argument("--device", choices=["auto", "gpu", "cpu"], default="auto")
    command("unload", "unload a model of the library now (the main model stays)").add_argument("name")
    worker = command("worker", "restart, stop or start a worker (gpu, cpu, gpu-embed, ...)")
    worker.add_argument("action", choices=["restart", "stop", "start"])
    worker.add_argument("role", help="gpu, cpu, gpu-embed, cpu-embed, or a library model's (gpu@NAME)")
    command("yield", "give the GPU to other programs: GPU jobs finish, then the GPU workers stop")
    command("resume", "take the GPU back after `failsoft yield` (as soon as the plan fits)")


def _resolve(target: str) -> Callable[[argparse.Namespace], int]:
    module_name, function_name = target.split(":")
    handler: Callable[[argparse.Namespace], int] = getattr(
        importlib.import_module(module_name), function_name
    )
    return handler


def _first_run_advice(args: argparse.Namespace) -> str:
    """What to do when no model is set up yet ("" when one is). A config that cannot be read is the tray's
    to tell: started from a desktop menu, it says so in a window (ui.app), where no terminal shows stderr."""
    from tray_app.library import first_run

    try:
        return first_run.message(config.load_config(args))
    except config.ConfigError:
        if args.command is None:
            return ""
        raise


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.config:
        os.environ["FAILSOFT_CONFIG"] = str(args.config)
    try:
        if args.command in SERVING and not getattr(args, "attach", None):
            advice = _first_run_advice(args)
            if advice:
                print(advice, file=sys.stderr)
                return 2
        return _resolve(HANDLERS[args.command])(args)
    except config.ConfigError as error:
        print(f"failsoft: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
