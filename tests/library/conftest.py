"""Fixtures of the library tests: a home whose model stores are only the ones a test builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tray_app.library import discovery


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home with no model stores, and none from the environment or the system."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for key in ("OLLAMA_MODELS", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(discovery, "SYSTEM_OLLAMA_STORES", ())
    return home
