"""The tray's "Models" submenu: each library model with where it is loaded, its VRAM and its keep-alive, and
Load / Unload. What it shows is worked out in `tray_app.view.state`; this module only puts it into menus."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu

from tray_app.contract.status import ModelStatus, ServiceStatus
from tray_app.ui.icons import swatch_icon
from tray_app.ui.notifications import Notice
from tray_app.view.reasons import REASON_WORDS, reason_text
from tray_app.view.state import is_loaded, library, load_block, model_details, model_line, unload_block

WHERE_COLORS = {"loading": "#f0a202", "not loaded": "#adb5bd"}
LOADED_COLOR = "#2f9e58"
# An action that can be clicked says what it does (a menu shows an action's text as its tooltip otherwise).
ACTION_TIPS = {
    "load": "Load it now, on the device the service chooses, so its next request does not wait",
    "unload": "Free its memory now; a request for it loads it again",
}


def menu_text(text: str) -> str:
    """Menus read "&" as a shortcut marker; a model's name keeps its own."""
    return text.replace("&", "&&")


def model_failure(name: str, action: str, message: str, error: dict[str, Any]) -> Notice:
    """A refused load or unload, with the error code in words when the tray has words for it."""
    code = str(error.get("code") or "")
    body = f"{reason_text(code)}: {message}" if code in REASON_WORDS else message
    return Notice(f"Could not {action} {name}", body[:1].upper() + body[1:], "critical", False)


class ModelMenu(QMenu):
    """One model: its line as the title, its details as disabled lines, Load and Unload."""

    def __init__(self, name: str, act: Callable[[str, str], None]) -> None:
        super().__init__()
        self.name = name
        self.setToolTipsVisible(True)  # the reason an action is off is its tooltip
        self.lines: list[QAction] = []
        self.actions_separator = self.addSeparator()
        self.load = self.addAction("Load", lambda: act(name, "load"))
        self.unload = self.addAction("Unload", lambda: act(name, "unload"))

    def update_from(self, model: ModelStatus, status: ServiceStatus, pending: bool) -> None:
        self.setTitle(menu_text(model_line(model)))
        where = str(model.get("where") or "not loaded")
        self.setIcon(swatch_icon(LOADED_COLOR if is_loaded(model) else WHERE_COLORS.get(where, "#adb5bd")))
        self._show_lines(model_details(model, status))
        busy = "Waiting for the service's answer" if pending else ""
        for action, kind, block in (
            (self.load, "load", load_block(model)),
            (self.unload, "unload", unload_block(model)),
        ):
            why = busy or block
            action.setEnabled(not why)
            action.setToolTip(why or ACTION_TIPS[kind])

    def _show_lines(self, texts: list[str]) -> None:
        while len(self.lines) < len(texts):
            line = QAction(self)
            line.setEnabled(False)
            self.insertAction(self.actions_separator, line)
            self.lines.append(line)
        for index, line in enumerate(self.lines):
            line.setVisible(index < len(texts))
            if index < len(texts):
                line.setText(menu_text(texts[index]))


class ModelsMenu(QMenu):
    """The library, one submenu per model; hidden when the service has no library."""

    def __init__(self, act: Callable[[str, str], None]) -> None:
        super().__init__("Models")
        self.act = act
        self.models: dict[str, ModelMenu] = {}
        self.pending: set[str] = set()  # models with a load or unload on its way

    def update_from(self, status: ServiceStatus | None, reachable: bool) -> None:
        """`status` None: the service never answered yet, so no library to show."""
        models = library(status) if status else []
        self.menuAction().setVisible(bool(models))
        names = [str(model["name"]) for model in models]
        if names != list(self.models):
            self._rebuild(names)  # only when the library itself changed: an open submenu stays open
        loaded = sum(1 for model in models if is_loaded(model))
        self.setTitle(f"Models ({loaded} of {len(models)} loaded)")
        for model in models:
            if status is not None:  # always, when there are models: they came from it
                self.models[str(model["name"])].update_from(model, status, str(model["name"]) in self.pending)
        self.setEnabled(reachable)

    def _rebuild(self, names: list[str]) -> None:
        self.clear()
        self.models = {name: ModelMenu(name, self.act) for name in names}
        for menu in self.models.values():
            self.addMenu(menu)
