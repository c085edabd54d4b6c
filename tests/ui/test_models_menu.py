"""The tray's Models menu drawn from a status with a model library, and its Load / Unload calls."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pytestqt.qtbot import QtBot

from tests.support.status_samples import make_library_status, make_status
from tests.ui.local_server import LocalService
from tray_app.contract.status import ServiceStatus
from tray_app.ui.api_client import ServiceClient
from tray_app.ui.models_menu import ACTION_TIPS
from tray_app.ui.notifications import Notice
from tray_app.ui.qt_events import QtEventBridge
from tray_app.ui.status_model import StatusModel
from tray_app.ui.tray import TrayIcon

API_KEY = "test-key"


@pytest.fixture
def tray(qtbot: QtBot, local_service: LocalService) -> Iterator[TrayIcon]:
    """A tray whose service is the local recording server (its status answer is the library status)."""
    local_service.answer("GET", "/failsoft/status", 200, make_library_status())
    client = ServiceClient(local_service.base_url, API_KEY)
    model = StatusModel(client, QtEventBridge())
    icon = TrayIcon(client, model, attached=False)
    yield icon
    model.stop()
    icon.icon.hide()


def show(tray: TrayIcon, status: ServiceStatus | None, reachable: bool = True) -> None:
    tray.model.status = status
    tray.model.reachable = reachable
    tray.model.changed.emit()


def recorded_notices(tray: TrayIcon) -> list[Notice]:
    notices: list[Notice] = []
    tray.show_notice = notices.append  # type: ignore[method-assign]
    return notices


def test_menu_lists_each_model_with_where_vram_and_keep_alive(tray: TrayIcon) -> None:
    show(tray, make_library_status())
    library = tray.library
    assert library.menuAction().isVisible()
    assert library.title() == "Models (2 of 3 loaded)"
    assert list(library.models) == ["qwen3-0.6b", "gemma3-270m", "phi-4-mini"]
    main, gemma, phi = library.models.values()
    assert main.title() == "qwen3-0.6b · main · on the GPU and the CPU · 344.00 MiB VRAM · 1 request running"
    assert gemma.title() == "gemma3-270m · on the GPU · 300.00 MiB VRAM · unloads in 42 s"
    assert phi.title() == "phi-4-mini · not loaded"
    gemma_lines = [line.text() for line in gemma.lines if line.isVisible()]
    assert gemma_lines == [
        "May run on the GPU or the CPU",
        "Unloads 5 min 00 s after its last request",
        "Idle for 4 min 18 s",
        "GPU worker gpu@gemma3-270m: ready · pid 5001 · 210.00 MiB",
        "CPU worker cpu@gemma3-270m: stopped",
    ]
    main_lines = [line.text() for line in main.lines if line.isVisible()]
    assert main_lines == [
        "Also called default",
        "May run on the GPU or the CPU",
        "Stand-in on the GPU: gemma3-270m",
        "Always kept loaded",
    ]


def test_actions_are_off_where_they_cannot_work_and_say_why(tray: TrayIcon) -> None:
    show(tray, make_library_status())
    main, gemma, phi = tray.library.models.values()
    assert not main.load.isEnabled() and not main.unload.isEnabled()
    assert main.unload.toolTip() == "The main model is never unloaded"
    assert not gemma.load.isEnabled() and gemma.load.toolTip() == "Already loaded on the GPU"
    assert gemma.unload.isEnabled() and gemma.unload.toolTip() == ACTION_TIPS["unload"]
    assert phi.load.isEnabled() and phi.load.toolTip() == ACTION_TIPS["load"]
    assert not phi.unload.isEnabled() and phi.unload.toolTip() == "Not loaded"


def test_unload_is_off_while_requests_run_on_the_model(tray: TrayIcon) -> None:
    show(tray, make_library_status(gemma_in_flight=2))
    gemma = tray.library.models["gemma3-270m"]
    assert gemma.title() == "gemma3-270m · on the GPU · 300.00 MiB VRAM · 2 requests running"
    assert not gemma.unload.isEnabled()
    assert gemma.unload.toolTip() == "2 requests run on it; it can be unloaded when they end"


def test_the_menu_follows_status_updates_in_place(tray: TrayIcon) -> None:
    show(tray, make_library_status())
    gemma = tray.library.models["gemma3-270m"]
    status = make_library_status()
    status["models"][1].update(where="not loaded", vram_bytes=0, unload_in=None, idle_seconds=None)
    show(tray, status)
    assert tray.library.models["gemma3-270m"] is gemma  # the same submenu: an open menu stays open
    assert gemma.title() == "gemma3-270m · not loaded"
    assert tray.library.title() == "Models (1 of 3 loaded)"
    assert gemma.load.isEnabled() and not gemma.unload.isEnabled()


def test_a_service_without_a_library_shows_no_models_menu(tray: TrayIcon) -> None:
    show(tray, make_status())
    assert not tray.library.menuAction().isVisible()
    show(tray, None, reachable=False)
    assert not tray.library.menuAction().isVisible()


def test_load_posts_to_the_model_with_the_key_and_refreshes(
    qtbot: QtBot, tray: TrayIcon, local_service: LocalService
) -> None:
    loaded = dict(make_library_status()["models"][2], where="cpu")
    local_service.answer("POST", "/failsoft/models/phi-4-mini/load", 200, loaded)
    show(tray, make_library_status())
    phi = tray.library.models["phi-4-mini"]
    phi.load.trigger()
    # Until the service answers, neither action can be clicked again.
    assert not phi.load.isEnabled() and phi.load.toolTip() == "Waiting for the service's answer"
    qtbot.waitUntil(lambda: bool(local_service.calls("POST", "/failsoft/models/phi-4-mini/load")))
    call = local_service.calls("POST", "/failsoft/models/phi-4-mini/load")[0]
    assert call.body == {"device": "auto"}
    assert call.headers["authorization"] == f"Bearer {API_KEY}"
    qtbot.waitUntil(lambda: "phi-4-mini" not in tray.library.pending)
    qtbot.waitUntil(lambda: bool(local_service.calls("GET", "/failsoft/status")))  # the menu catches up


def test_unload_posts_to_the_model(qtbot: QtBot, tray: TrayIcon, local_service: LocalService) -> None:
    local_service.answer(
        "POST", "/failsoft/models/gemma3-270m/unload", 200, make_library_status()["models"][1]
    )
    notices = recorded_notices(tray)
    show(tray, make_library_status())
    tray.library.models["gemma3-270m"].unload.trigger()
    qtbot.waitUntil(lambda: "gemma3-270m" not in tray.library.pending)
    assert len(local_service.calls("POST", "/failsoft/models/gemma3-270m/unload")) == 1
    assert not local_service.calls("POST", "/failsoft/models/gemma3-270m/load")
    assert notices == []


def test_a_refused_unload_is_shown_with_its_code_in_words(
    qtbot: QtBot, tray: TrayIcon, local_service: LocalService
) -> None:
    error = {"message": "1 request runs on gemma3-270m", "type": "conflict", "code": "model_busy"}
    local_service.answer("POST", "/failsoft/models/gemma3-270m/unload", 409, {"error": error})
    notices = recorded_notices(tray)
    show(tray, make_library_status())
    tray.library.models["gemma3-270m"].unload.trigger()
    qtbot.waitUntil(lambda: bool(notices))
    assert notices == [
        Notice(
            "Could not unload gemma3-270m",
            "Requests are running on the model (model_busy): 1 request runs on gemma3-270m",
            "critical",
            False,
        )
    ]
    assert tray.library.models["gemma3-270m"].unload.isEnabled()  # no longer waiting


def test_a_model_that_does_not_fit_says_so(qtbot: QtBot, tray: TrayIcon, local_service: LocalService) -> None:
    error = {"message": "phi-4-mini needs 2.10 GiB, 1.20 GiB free", "code": "model_does_not_fit"}
    local_service.answer("POST", "/failsoft/models/phi-4-mini/load", 409, {"error": error})
    notices = recorded_notices(tray)
    show(tray, make_library_status())
    tray.library.models["phi-4-mini"].load.trigger()
    qtbot.waitUntil(lambda: bool(notices))
    assert notices[0].title == "Could not load phi-4-mini"
    assert notices[0].body.startswith("The model does not fit in the memory free now (model_does_not_fit): ")


def test_a_model_name_is_escaped_in_the_path(
    qtbot: QtBot, tray: TrayIcon, local_service: LocalService
) -> None:
    status = make_library_status()
    status["models"][2]["name"] = "org/phi:mini"
    local_service.answer("POST", "/failsoft/models/org%2Fphi%3Amini/load", 200, status["models"][2])
    show(tray, status)
    tray.library.models["org/phi:mini"].load.trigger()
    qtbot.waitUntil(lambda: bool(local_service.calls("POST", "/failsoft/models/org%2Fphi%3Amini/load")))


def test_a_library_worker_event_lands_beside_the_other_library_workers(tray: TrayIcon) -> None:
    show(tray, make_library_status())
    tray.model.apply_event(
        {"type": "worker_state", "role": "cpu@gemma3-270m", "new": "starting", "pid": 5002}
    )
    status = tray.model.status or {}
    assert status["library_workers"]["cpu@gemma3-270m"]["state"] == "starting"
    assert "cpu@gemma3-270m" not in status["workers"]
    lines = [line.text() for line in tray.library.models["gemma3-270m"].lines if line.isVisible()]
    assert "CPU worker cpu@gemma3-270m: starting · pid 5002" in lines
