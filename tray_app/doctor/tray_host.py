"""Can a tray icon show on this desktop? Asked without Qt, the way a tray icon finds its host.

- StatusNotifierItem (KDE, GNOME with the AppIndicator extension, most Wayland panels): a watcher owns
  `org.kde.StatusNotifierWatcher` on the session bus; asked through `dbus-send`.
- XEmbed (older X11 panels, trayer): a tray manager owns the X selection `_NET_SYSTEM_TRAY_S<screen>`;
  asked through libX11 (XGetSelectionOwner) with ctypes.

Each answer is "yes", "no" or "unknown" (the tool or library is missing), with what was asked.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Any, Literal

Answer = Literal["yes", "no", "unknown"]
WATCHER = "org.kde.StatusNotifierWatcher"


@dataclass(frozen=True)
class Probe:
    answer: Answer
    detail: str


@dataclass(frozen=True)
class TrayHost:
    status_notifier: Probe
    xembed: Probe

    @property
    def answer(self) -> Answer:
        answers = {self.status_notifier.answer, self.xembed.answer}
        if "yes" in answers:
            return "yes"
        return "unknown" if "unknown" in answers else "no"

    def to_dict(self) -> dict[str, Any]:
        return {
            "answer": self.answer,
            "status_notifier": asdict(self.status_notifier),
            "xembed": asdict(self.xembed),
        }


def status_notifier_watcher() -> Probe:
    if not os.environ.get("DBUS_SESSION_BUS_ADDRESS") and not os.environ.get("XDG_RUNTIME_DIR"):
        return Probe("no", "no session D-Bus (DBUS_SESSION_BUS_ADDRESS is not set)")
    tool = shutil.which("dbus-send")
    if tool is None:
        return Probe("unknown", "dbus-send is not installed (Debian: dbus-bin)")
    command = [
        tool, "--session", "--print-reply", "--dest=org.freedesktop.DBus", "/org/freedesktop/DBus",
        "org.freedesktop.DBus.NameHasOwner", f"string:{WATCHER}",
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=5, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        return Probe("unknown", f"dbus-send failed: {error}")
    if done.returncode != 0:
        return Probe("no", f"no session D-Bus answered: {done.stderr.strip() or done.returncode}")
    if "boolean true" in done.stdout:
        return Probe("yes", f"{WATCHER} is owned on the session bus")
    return Probe("no", f"nothing owns {WATCHER} on the session bus")


def xembed_tray() -> Probe:
    display_name = os.environ.get("DISPLAY")
    if not display_name:
        return Probe("no", "no X display (DISPLAY is not set)")
    library = ctypes.util.find_library("X11")
    if library is None:
        return Probe("unknown", "libX11 is not installed")
    x11 = ctypes.CDLL(library)
    x11.XOpenDisplay.restype = ctypes.c_void_p
    x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
    x11.XDefaultScreen.argtypes = [ctypes.c_void_p]
    x11.XInternAtom.restype = ctypes.c_ulong
    x11.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    x11.XGetSelectionOwner.restype = ctypes.c_ulong
    x11.XGetSelectionOwner.argtypes = [ctypes.c_void_p, ctypes.c_ulong]
    x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
    display = x11.XOpenDisplay(display_name.encode())
    if not display:
        return Probe("no", f"cannot open X display {display_name}")
    try:
        selection = f"_NET_SYSTEM_TRAY_S{x11.XDefaultScreen(display)}"
        atom = x11.XInternAtom(display, selection.encode(), 0)
        owner = x11.XGetSelectionOwner(display, atom)
    finally:
        x11.XCloseDisplay(display)
    if owner:
        return Probe("yes", f"{selection} is owned by window {owner:#x} on {display_name}")
    return Probe("no", f"nothing owns {selection} on {display_name}")


def probe() -> TrayHost:
    return TrayHost(status_notifier=status_notifier_watcher(), xembed=xembed_tray())
