"""Each test gets its own runtime folder, so its simulated GPU's ledger is nobody else's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tray_app.device.ledger import Ledger

GIB = 1024**3
MIB = 1024**2


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "run"
    monkeypatch.setenv("FAILSOFT_RUNTIME_DIR", str(folder))
    return folder


@pytest.fixture
def ledger(runtime_dir: Path) -> Iterator[Ledger]:
    """A running 8 GiB simulated GPU, owned by this test's process, at the default path."""
    ledger = Ledger()
    ledger.create(8 * GIB)
    yield ledger
    ledger.remove()
