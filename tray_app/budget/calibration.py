"""Buffer sizes llama.cpp reported for a model at given settings, kept in the data dir so that the next plan
uses the measured compute buffer instead of the estimate (estimate first, then measure).

One small JSON file per (model, settings): writers in different processes (the GPU and the CPU worker) never
read-modify-write a shared file, and each file is replaced atomically.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

from tray_app import paths
from tray_app.budget.footprint import padded_context
from tray_app.budget.plan import ComputeSettings, MeasuredCompute
from tray_app.engine.llama_log import BufferSizes

log = logging.getLogger(__name__)
_FORMAT = 1


def _model_key(model_path: Path) -> str:
    # Name and size identify a model file and survive moving it; a re-quantised file has another size.
    return f"{model_path.name}-{model_path.stat().st_size}"


def _normalised(settings: ComputeSettings) -> ComputeSettings:
    """The settings as llama.cpp applies them (padded context): asking for 2000 finds the 2048 measurement."""
    n_ctx, _ = padded_context(settings.n_ctx, settings.n_parallel)
    return replace(settings, n_ctx=n_ctx)


def _settings_key(settings: ComputeSettings) -> str:
    text = json.dumps(asdict(settings), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def calibration_dir() -> Path:
    return paths.data_dir() / "calibration"


def measurement_file(model_path: Path, settings: ComputeSettings) -> Path:
    return calibration_dir() / _model_key(Path(model_path)) / f"{_settings_key(_normalised(settings))}.json"


def record_measurement(model_path: str | Path, settings: ComputeSettings, buffers: BufferSizes) -> Path:
    """Keep what llama.cpp reported after loading `model_path` with `settings`; returns the file written."""
    target = measurement_file(Path(model_path), settings)
    target.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "format": _FORMAT,
        "model": Path(model_path).name,
        "settings": asdict(_normalised(settings)),
        "buffers": buffers.to_dict(),
        "recorded_at": time.time(),
    }
    handle, temporary = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
    with os.fdopen(handle, "w", encoding="utf-8") as stream:
        json.dump(record, stream, indent=2)
    os.replace(temporary, target)
    return target


def lookup_measurement(model_path: str | Path, settings: ComputeSettings) -> BufferSizes | None:
    """What was measured for this model and these settings, or None (never measured, or unreadable)."""
    path = Path(model_path)
    if not path.is_file():
        return None
    target = measurement_file(path, settings)
    try:
        record = json.loads(target.read_text(encoding="utf-8"))
        if record.get("format") != _FORMAT or record.get("settings") != asdict(_normalised(settings)):
            return None
        buffers = record["buffers"]
        return BufferSizes(
            model_bytes=int(buffers["model_bytes"]),
            kv_bytes=int(buffers["kv_bytes"]),
            compute_bytes=int(buffers["compute_bytes"]),
            output_bytes=int(buffers["output_bytes"]),
            model_buffers=tuple(
                (str(name), int(size)) for name, size in buffers.get("model_buffers", {}).items()
            ),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
        # A damaged measurement must not stop planning: the estimate is used instead.
        log.warning("ignoring unreadable calibration file %s: %s", target, error)
        return None


def measured_compute(model_path: str | Path) -> MeasuredCompute:
    """The planner's lookup for one model: the measured compute buffer at given settings, if there is one."""

    def lookup(settings: ComputeSettings) -> int | None:
        found = lookup_measurement(model_path, settings)
        return found.compute_bytes if found is not None and found.compute_bytes > 0 else None

    return lookup
