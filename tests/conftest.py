"""Shared test set-up: every test gets its own config, data and log dirs, so nothing touches the user's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import models


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("FAILSOFT_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("FAILSOFT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FAILSOFT_LOG_DIR", str(tmp_path / "logs"))
    # Its own simulated GPU: services and hogs of tests running side by side never share a ledger.
    monkeypatch.setenv("FAILSOFT_RUNTIME_DIR", str(tmp_path / "run"))
    yield tmp_path


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The bundled SmolLM2 GGUF; the set-up installs it, so its absence is a failure, not a skip."""
    return models.smollm2_path()


@pytest.fixture(scope="session")
def gemma_model_path() -> Path:
    """The second real model, Gemma 3 270M (sliding-window attention); missing: a failure, not a skip."""
    return models.gemma_path()


@pytest.fixture(scope="module")
def module_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("service")
