"""A real `failsoft serve --simulate-vram` on fake llama-servers: its simulated GPU is a ledger in its own
runtime folder from start to stop, its GPU worker's planned share is held there under the worker's pid, and
the debug pressure endpoint takes from the same ledger."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.fake_worker import fake_llama_server
from tests.support.helpers import base_settings
from tests.support.service import running_service
from tray_app.device.ledger import LEDGER_FILE, Ledger

GIB = 1024**3


def test_the_service_owns_its_ledger_and_holds_the_gpu_workers_share(tmp_path: Path) -> None:
    engine = fake_llama_server(tmp_path)
    settings = base_settings(engine={"llama_server": str(engine)})
    root = tmp_path / "service"
    with running_service(root, enable_faults=True, settings=settings, ready_timeout=30) as svc:
        ledger = Ledger(svc.runtime_dir / LEDGER_FILE)
        status = svc.status()
        state = ledger.read()
        assert state.total_bytes == 4 * GIB and state.owner_pid == svc.process.pid
        gpu_pid, cpu_pid = status["workers"]["gpu"]["pid"], status["workers"]["cpu"]["pid"]
        assert state.held_by(gpu_pid) == {
            "gpu": status["plan"]["weights_bytes"]
            + status["plan"]["kv_bytes"]
            + status["plan"]["compute_bytes"]
        }
        assert state.held_by(cpu_pid) == {}

        taken = httpx.post(
            svc.base_url + "/failsoft/debug/pressure",
            json={"take": "1GiB", "label": "drill"},
            headers=svc.headers(),
            timeout=30,
        )
        assert taken.status_code == 200, taken.text
        assert ledger.read().held_by(svc.process.pid) == {"drill": 1 * GIB}
        assert taken.json()["plan"]["other_bytes"] == 1 * GIB  # planned again on the watcher's reading
        released = httpx.post(
            svc.base_url + "/failsoft/debug/pressure", json={"release": "drill"}, headers=svc.headers()
        )
        assert released.json()["released"] == 1 * GIB
    assert not ledger.path.exists()  # the simulated GPU went away with the service
