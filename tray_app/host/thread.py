"""The service in-process, on its own thread and asyncio loop (how the tray runs it by default)."""

from __future__ import annotations

import threading

import uvicorn

from tray_app.config import Config
from tray_app.contract.events import EventBus
from tray_app.host import event_loop
from tray_app.host.bind import listening_socket
from tray_app.host.serve_command import check_bind, uvicorn_config
from tray_app.host.service import Service
from tray_app.server.routes import create_app


class ServiceThread:
    """`start()` returns the base URL once the HTTP server listens (workers may still be loading: watch
    /failsoft/status or the bus); `stop()` shuts everything down, workers included.

    `port=None` uses the configured port; `port=0` lets the OS choose a free one.
    """

    def __init__(
        self,
        cfg: Config,
        *,
        enable_faults: bool = False,
        bus: EventBus | None = None,
        port: int | None = None,
    ) -> None:
        check_bind(cfg)
        self.cfg = cfg
        self.enable_faults = enable_faults
        self.bus = bus or EventBus()
        self._port = cfg.server.port if port is None else port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.service: Service | None = None
        self.base_url = ""

    def start(self, timeout: float = 60.0) -> str:
        sock = listening_socket(self.cfg.server.host, self._port)
        host, port = sock.getsockname()[:2]
        try:
            self.service = Service(self.cfg, enable_faults=self.enable_faults, bus=self.bus)
        except BaseException:
            sock.close()  # the port is free again for whatever the user does next
            raise
        config = uvicorn_config(create_app(self.service), host, port)
        self._server = uvicorn.Server(config)
        server = self._server

        def run() -> None:
            try:
                event_loop.run(server.serve(sockets=[sock]))
            except BaseException as error:  # reported to the caller of start()
                self._error = error
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name="failsoft-service", daemon=True)
        self._thread.start()
        deadline = threading.Event()
        waited = 0.0
        while not server.started and self._thread.is_alive() and waited < timeout:
            deadline.wait(0.05)
            waited += 0.05
        if not server.started:
            self.stop()
            raise RuntimeError(f"the service did not start: {self._error!r}")
        self.base_url = f"http://{host}:{port}"
        return self.base_url

    def stop(self, timeout: float = 30.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None
