"""The settings dialog refuses what the config would refuse, writes what it accepts, and says which
changes need the workers restarted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from tray_app import config
from tray_app.ui.settings import SettingsDialog


@pytest.fixture
def dialog(qtbot: QtBot, tmp_path: Path) -> SettingsDialog:
    window = SettingsDialog(None, tmp_path / "config.toml")
    qtbot.addWidget(window)
    return window


def test_defaults_fill_the_form(dialog: SettingsDialog) -> None:
    defaults = config.Config()
    assert dialog.reserve_percent.value() == defaults.budget.reserve_percent
    assert dialog.n_parallel.value() == defaults.budget.n_parallel
    assert dialog.fallback.currentData() == defaults.failover.fallback
    assert dialog.deadline.value() == defaults.failover.deadline


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.reserve_percent.setValue(100), "budget.reserve_percent = 100.0 must be in [0, 100)"),
        (lambda d: d.n_parallel.setValue(0), "budget.n_parallel must be at least 1"),
        (lambda d: d.reserve_min.setText("lots"), "not a size: 'lots'"),
        (lambda d: d.simulate_vram.setText("4 bananas"), "not a size: '4 bananas'"),
        (
            lambda d: (d.flash_attn.setChecked(False), d.cache_type.setCurrentText("q8_0")),
            "needs budget.flash_attn",
        ),
        (lambda d: d.model_path.setText("/nonexistent/model.gguf"), "is not a file"),
    ],
)
def test_invalid_values_are_refused_with_a_message(
    dialog: SettingsDialog, change: Callable[[SettingsDialog], object], message: str
) -> None:
    change(dialog)
    assert dialog.save() is False
    assert message in dialog.message.text()
    assert dialog.message.text().startswith("Not saved")
    assert not dialog.config_path.exists()


def test_a_file_that_is_not_gguf_is_refused(dialog: SettingsDialog, tmp_path: Path) -> None:
    fake = tmp_path / "notes.gguf"
    fake.write_text("hello", encoding="utf-8")
    dialog.model_path.setText(str(fake))
    assert dialog.save() is False
    assert "is not a GGUF model file" in dialog.message.text()


def test_caps_need_a_restart_and_are_written(dialog: SettingsDialog, model_path: Path) -> None:
    dialog.n_ctx.setValue(2048)
    dialog.n_parallel.setValue(2)
    dialog.model_path.setText(str(model_path))
    assert dialog.save() is True
    saved = config.load(dialog.config_path)
    assert (saved.budget.n_ctx, saved.budget.n_parallel, saved.model.path) == (2048, 2, str(model_path))
    assert not dialog.restart_banner.isHidden()
    text = dialog.restart_text.text()
    assert "model file" in text and "context cap" in text and "concurrency" in text
    assert "Restart needed" in text


def test_policy_changes_apply_without_restart(dialog: SettingsDialog) -> None:
    dialog.fallback.setCurrentIndex(dialog.fallback.findData("approval"))
    dialog.deadline.setValue(90)
    assert dialog.save() is True
    saved = config.load(dialog.config_path)
    assert (saved.failover.fallback, saved.failover.deadline) == ("approval", 90.0)
    assert dialog.restart_banner.isHidden()
    assert "fallback policy" in dialog.message.text() and "deadline" in dialog.message.text()


def test_existing_settings_are_kept(dialog: SettingsDialog) -> None:
    dialog.config_path.write_text("[server]\nport = 9999\n[cpu]\nthreads = 3\n", encoding="utf-8")
    dialog.load()
    dialog.deadline.setValue(30)
    assert dialog.save() is True
    saved = config.load(dialog.config_path)
    assert (saved.server.port, saved.cpu.threads, saved.failover.deadline) == (9999, 3, 30.0)
