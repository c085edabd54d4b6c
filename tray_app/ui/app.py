"""`failsoft` with no subcommand: the tray, on top of a service it starts or attached to a running one.

The tray starts `failsoft serve` as its child process (host/service_child.py), in a process group of its own,
and talks to it over HTTP like any other client: a crash of the service's native code ends that process, not
the tray, which says so and starts it again. The same tray can watch a headless `failsoft serve` elsewhere
(`--attach URL`), or the one already running at its own address (a systemd unit). Quitting stops the service
only when the tray started it. One tray per address: a second start opens the first one's chat window
(single_instance).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tray_app import config, paths
from tray_app.config import load_config
from tray_app.host.service_probe import local_url, probe_service

if TYPE_CHECKING:
    from tray_app.host.service_child import ServiceChild
    from tray_app.ui.controller import TrayApp
    from tray_app.ui.service_child_qt import QtServiceChild
    from tray_app.ui.single_instance import TrayInstance

log = logging.getLogger(__name__)

# Set to a directory: the tray writes what it shows (state, tray geometry, open windows) to ui-state.json
# there, so an automated desktop test can check the real tray without reading pixels.
AUTOMATION_ENV = "FAILSOFT_UI_AUTOMATION"


def display_problem(env: Mapping[str, str], platform: str = sys.platform) -> str | None:
    """Why Qt could not open a window here, or None. Checked before Qt, which would abort instead."""
    if not platform.startswith("linux") or env.get("QT_QPA_PLATFORM") or env.get("WAYLAND_DISPLAY"):
        return None
    display = env.get("DISPLAY", "")
    if not display:
        reason = "no display found (DISPLAY and WAYLAND_DISPLAY are not set)"
    elif display.startswith(":") and not Path(f"/tmp/.X11-unix/X{display[1:].split('.')[0]}").exists():
        reason = f"no X server answers on DISPLAY={display}"
    else:
        return None
    return (
        f"failsoft: {reason}, so the tray cannot start.\n"
        "  On a server without a desktop, run the service alone:  failsoft serve\n"
        "  and watch it from a desktop machine with:                failsoft --attach http://HOST:8750"
    )


def _config_path(cfg: config.Config) -> Path:
    return Path(cfg.source) if cfg.source else paths.config_file()


def run(args: argparse.Namespace) -> int:
    problem = display_problem(os.environ)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The readiness checks of the service child: one log line per request is noise here.
    logging.getLogger("httpx").setLevel(logging.WARNING)

    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "failsoft"])
    assert isinstance(app, QApplication)
    app.setApplicationName("Failsoft")
    app.setDesktopFileName("failsoft")
    app.setQuitOnLastWindowClosed(False)
    try:
        cfg = load_config(args)
    except config.ConfigError as error:
        return cannot_start(app, f"failsoft: {error}", 2)

    from tray_app.ui.single_instance import TrayInstance

    url = str(args.attach).rstrip("/") if args.attach else local_url(cfg.server.host, cfg.server.port)
    instance = TrayInstance(url)
    if not instance.claim():
        if instance.activate_running():
            print(f"failsoft: Failsoft's tray for {url} is already running; it opens its chat window.")
            return 0
        return cannot_start(
            app, f"failsoft: Failsoft's tray for {url} is already running, and did not answer.", 1
        )
    try:
        return _tray_for(app, url, cfg, args, instance)
    finally:
        instance.release()


def _tray_for(
    app: Any, url: str, cfg: config.Config, args: argparse.Namespace, instance: TrayInstance
) -> int:
    """The tray for `url`: attached to the service there (`--attach`, or one already running), else on a
    service of its own."""
    if args.attach:  # a token found on this machine goes to its own service only: elsewhere, --admin-token
        return _run_tray(app, url, cfg, None, instance, admin=(args.admin_token or "").strip())
    probe = probe_service(url, cfg.server.api_key)
    if probe.found == "failsoft":
        # E.g. `failsoft serve` as a systemd unit and the tray started at login: the tray shows that one.
        log.info(
            "%s is running already: the tray shows it (quitting the tray leaves it running)", probe.detail
        )
        return _run_tray(app, url, cfg, None, instance)
    if probe.found != "nothing":
        return cannot_start(
            app,
            f"failsoft: {probe.detail}, where the tray would start its service.\n"
            "  Another port: [server] port in the config (or --config with another file); the API key of a "
            "running Failsoft: [server] api_key",
            1,
        )
    from tray_app.host.service_child import ServiceChild, default_log_path, health_answers, serve_argv

    argv = serve_argv(
        sys.executable,
        config=args.config,
        model=args.model,
        simulate_vram=args.simulate_vram,
        host=cfg.server.host,
        port=cfg.server.port,
        enable_faults=bool(args.enable_faults),
    )
    # Its output goes to a file: a pipe nobody reads would fill and stall it.
    child = ServiceChild(argv, default_log_path(paths.log_dir()), health_answers(url))
    try:
        return _run_tray(app, url, cfg, child, instance)
    finally:
        child.stop()


def _run_tray(
    app: Any,
    base_url: str,
    cfg: config.Config,
    child: ServiceChild | None,
    instance: TrayInstance,
    admin: str = "",
) -> int:
    """The tray at once; the service child (if any) starts meanwhile, and again after a crash. Another
    start of the tray (`instance`) opens the chat window."""
    from tray_app.host.service_child import Start
    from tray_app.ui.controller import TrayApp

    automation = os.environ.get(AUTOMATION_ENV)
    tray_app = TrayApp(
        base_url,
        api_key=cfg.server.api_key,
        config_path=_config_path(cfg),
        attached=child is None,
        state_file=Path(automation) / "ui-state.json" if automation else None,
        admin=admin,
    )
    tray_app.quit_requested.connect(app.quit)
    instance.activated.connect(tray_app.show_chat)
    _quit_on_signals(app)
    failure: list[str] = []
    if child is not None:
        runner = _child_runner(app, tray_app, child, base_url, cfg.server.api_key, failure)
        tray_app.model.starting = True
        if runner.start() is not Start.OK:
            return cannot_start(app, f"failsoft: the service could not start on {base_url} (see the log)", 1)
    tray_app.start()
    try:
        status: int = app.exec()
    finally:
        tray_app.stop()
    return cannot_start(app, failure[0], status) if failure else status


def _child_runner(
    app: Any, tray_app: TrayApp, child: ServiceChild, base_url: str, api_key: str, failure: list[str]
) -> QtServiceChild:
    """The service child wired to the tray: a failed start ends the event loop, its reason put in `failure`;
    a service that took the address meanwhile is the one the tray shows."""
    from tray_app.ui.service_child_qt import QtServiceChild

    runner = QtServiceChild(child, lambda: probe_service(base_url, api_key), tray_app)

    def start_failed(message: str) -> None:
        failure.append(f"failsoft: the service could not start on {base_url}: {message}")
        app.exit(1)

    def found_running(detail: str) -> None:
        # Started beside the tray (both at login) and bound the port first: the tray shows that one.
        log.info("%s started meanwhile: the tray shows it (quitting leaves it running)", detail)
        tray_app.attach()

    runner.failed.connect(start_failed)
    runner.found_running.connect(found_running)
    runner.changed.connect(tray_app.service_child_changed)
    return runner


def cannot_start(app: Any, message: str, status: int) -> int:
    """Failsoft cannot start: why, on stderr and, when a desktop started it (no terminal to read it in), in
    a message box. Returns `status`."""
    print(message, file=sys.stderr)
    if not sys.stderr.isatty() and app.platformName() not in ("offscreen", "minimal"):
        from PySide6.QtWidgets import QMessageBox

        QMessageBox.critical(None, "Failsoft could not start", message.removeprefix("failsoft: "))
    return status


def _quit_on_signals(app: Any) -> None:
    """SIGTERM/SIGINT quit the event loop cleanly (so an in-process service is stopped)."""
    from PySide6.QtCore import QTimer

    def quit_app(_signum: int, _frame: object) -> None:
        app.quit()

    signal.signal(signal.SIGTERM, quit_app)
    signal.signal(signal.SIGINT, quit_app)
    # Python runs signal handlers only between bytecodes; a timer gives it the chance while Qt waits.
    wake = QTimer(app)
    wake.timeout.connect(lambda: None)
    wake.start(250)
