"""The VRAM timeline as data, from `GET /failsoft/device/history` and the plan: per reading, the main model's
weights, KV cache and compute, the other models, each other program, and free, stacked up to the device's
total; the reserve line; and markers for failovers, restarts, loads and the GPU path's changes. No Qt here:
the timeline window draws exactly these series."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tray_app.view.budget_split import MAIN_MODEL_KEYS, MODEL_COLORS, SEGMENTS

OTHER_COLORS = ("#c2255c", "#e64980", "#f06595", "#a61e4d", "#d6336c")
FREE_COLOR = "#dee2e6"
MAX_PROGRAMS = 5  # named programs drawn apart; the rest share one band
MARKER_COLORS = {"failover": "#e8590c", "restart": "#fa5252", "load": "#2f9e44", "path": "#7048e8"}


@dataclass
class Series:
    key: str
    label: str
    color: str
    values: list[float] = field(default_factory=list)  # bytes, one per reading


@dataclass(frozen=True)
class Marker:
    at: float  # seconds relative to the newest reading (negative: before it)
    kind: str  # failover, restart, load, path
    text: str

    @property
    def color(self) -> str:
        return MARKER_COLORS.get(self.kind, "#495057")


@dataclass
class Timeline:
    times: list[float]  # seconds relative to the newest reading
    series: list[Series]  # bottom to top; they add up to the device's total at each reading
    total_bytes: int
    reserve_bytes: int
    markers: list[Marker]
    note: str = ""  # why there is nothing to draw

    @property
    def empty(self) -> bool:
        return not self.times


def _main_split(plan: Mapping[str, Any]) -> dict[str, float]:
    """How the main model's GPU memory divides into weights, KV cache and compute, from its plan."""
    parts = {key: float(plan.get(f"{key}_bytes") or 0) for key in MAIN_MODEL_KEYS}  # weights, kv, compute
    whole = sum(parts.values())
    return {key: value / whole for key, value in parts.items()} if whole > 0 else {}


def _programs(samples: Sequence[Mapping[str, Any]]) -> list[str]:
    """The other programs seen, largest first (by their peak), as "label (name, pid N)" or "name (pid N)"."""
    peaks: dict[str, float] = {}
    for sample in samples:
        for process in sample.get("processes") or []:
            if not process.get("own"):
                name = describe(process)
                peaks[name] = max(peaks.get(name, 0.0), float(process.get("used_bytes") or 0))
    return sorted(peaks, key=lambda name: -peaks[name])


def describe(process: Mapping[str, Any]) -> str:
    label, name, pid = process.get("label") or "", process.get("name") or "?", process.get("pid")
    return f"{label} ({name}, pid {pid})" if label and label != name else f"{name} (pid {pid})"


class Usage(NamedTuple):
    """One reading's used memory by whom: Failsoft's main model, its other models, each other program."""

    main: float
    models: float
    programs: dict[str, float]  # by describe()


def _usage(sample: Mapping[str, Any]) -> Usage:
    main = models = 0.0
    programs: dict[str, float] = {}
    for process in sample.get("processes") or []:
        used = float(process.get("used_bytes") or 0)
        if process.get("own"):
            # The main model's GPU worker is "gpu" on the simulated ledger; through NVML no label tells
            # it from a library model's worker, so all of Failsoft's is split as the main model's.
            if process.get("label") in ("gpu", ""):
                main += used
            else:
                models += used
        else:
            name = describe(process)
            programs[name] = programs.get(name, 0.0) + used
    return Usage(main, models, programs)


def timeline(history: Mapping[str, Any], plan: Mapping[str, Any] | None) -> Timeline:
    """The stacked series of a history (oldest reading first) with the plan's split of the main model."""
    samples = [s for s in history.get("samples") or [] if s.get("state") == "normal"]
    reserve = int(history.get("reserve_bytes") or 0)
    if not samples:
        note = "no reading of the GPU yet" if history.get("watching") else str(history.get("reason") or "")
        return Timeline([], [], 0, reserve, [], note or "the service watches no GPU")
    newest = float(samples[-1]["at"])
    split = _main_split(plan or {})
    colors = {key: color for key, _label, color, _keys in SEGMENTS}
    labels = {key: label for key, label, _color, _keys in SEGMENTS}
    main = [Series(key, labels[key], colors[key]) for key in MAIN_MODEL_KEYS]
    models = Series("models", "Other models", MODEL_COLORS[0])
    shown = _programs(samples)[:MAX_PROGRAMS]
    programs = [
        Series(f"program:{name}", name, OTHER_COLORS[i % len(OTHER_COLORS)]) for i, name in enumerate(shown)
    ]
    rest = Series("programs", "Other programs", "#862e9c")
    unlisted = Series("unlisted", "Driver and unlisted", "#868e96")
    free = Series("free", "Free", FREE_COLOR)
    for sample in samples:
        usage = _usage(sample)
        for band in main:  # no plan: all of it is shown as weights
            band.values.append(usage.main * split.get(band.key, 1.0 if band.key == "weights" else 0.0))
        models.values.append(usage.models)
        for band in programs:
            band.values.append(usage.programs.get(band.label, 0.0))
        rest.values.append(sum(v for name, v in usage.programs.items() if name not in shown))
        listed = usage.main + usage.models + sum(usage.programs.values())
        unlisted.values.append(max(float(sample.get("used_bytes") or 0) - listed, 0.0))
        free.values.append(float(sample.get("free_bytes") or 0))
    bands = [*main, models, *programs, rest, unlisted, free]
    return Timeline(
        times=[float(s["at"]) - newest for s in samples],
        series=[band for band in bands if any(band.values) or band.key == "free"],
        total_bytes=int(samples[-1].get("total_bytes") or 0),
        reserve_bytes=reserve,
        markers=_markers(history, float(samples[0]["at"]), newest),
    )


def _markers(history: Mapping[str, Any], oldest: float, newest: float) -> list[Marker]:
    """The history's markers from its oldest reading on (an older one has no band under it), timed from the
    newest reading."""
    return [
        Marker(float(m["at"]) - newest, str(m["kind"]), str(m["text"]))
        for m in history.get("markers") or []
        if float(m.get("at") or 0) >= oldest
    ]


def stacked(series: Sequence[Series]) -> list[list[float]]:
    """Each series' top edge: the running sum from the bottom, reading by reading."""
    tops: list[list[float]] = []
    running: list[float] = []
    for one in series:
        running = [a + b for a, b in zip(running, one.values, strict=True)] if running else list(one.values)
        tops.append(running)
    return tops
