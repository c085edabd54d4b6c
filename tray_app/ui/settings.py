"""The settings dialog: model, caps, reserve, fallback policy and deadline, written to the config file.

Values are validated by the config module itself (the same rules as loading the file), so a value the service
would refuse never reaches the file. Changes that the running workers were built with need a restart: the
dialog says which, and restarts the workers only when asked to.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from tray_app import config
from tray_app.ui.api_client import ServiceClient
from tray_app.ui.config_io import needs_restart
from tray_app.ui.icons import app_icon

KEY_LABELS = {
    ("model", "path"): "model file",
    ("device", "simulate_vram"): "simulated GPU memory",
    ("budget", "n_ctx"): "context cap",
    ("budget", "max_ctx"): "largest context",
    ("budget", "n_parallel"): "concurrency",
    ("budget", "reserve_percent"): "reserve",
    ("budget", "reserve_min"): "minimum reserve",
    ("budget", "cache_type"): "KV cache type",
    ("budget", "flash_attn"): "flash attention",
    ("failover", "fallback"): "fallback policy",
    ("failover", "deadline"): "deadline",
    ("failover", "auto_approve_seconds"): "auto-approve threshold",
}
FALLBACK_CHOICES = (
    ("auto", "Automatic: replay on the CPU when it meets the deadline"),
    ("approval", "Ask me: CPU runs wait for approval"),
    ("never", "Never: fail with a clear error instead"),
)


def describe(keys: list[tuple[str, str]]) -> str:
    return ", ".join(KEY_LABELS.get(key, ".".join(key)) for key in keys)


def _spin(maximum: int, special: str = "") -> QSpinBox:
    box = QSpinBox()
    box.setRange(0, maximum)
    box.setGroupSeparatorShown(True)
    if special:
        box.setSpecialValueText(special)
    return box


def _seconds(maximum: float, special: str = "") -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(0, maximum)
    box.setDecimals(0)
    box.setSuffix(" s")
    if special:
        box.setSpecialValueText(special)
    return box


class SettingsDialog(QDialog):
    saved = Signal(list)  # the (section, key) pairs that changed

    def __init__(
        self, client: ServiceClient | None, config_path: Path, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.client = client
        self.config_path = config_path
        self.pending_restart: list[tuple[str, str]] = []
        self.setWindowTitle("Failsoft — Settings")
        self.setWindowIcon(app_icon())
        self.setMinimumWidth(560)

        layout = QVBoxLayout(self)
        layout.addWidget(self._build_gpu_group())
        layout.addWidget(self._build_failover_group())
        self.message = QLabel("")
        self.message.setWordWrap(True)
        layout.addWidget(self.message)
        layout.addWidget(self._build_restart_banner())
        layout.addLayout(self._build_buttons())
        self.load()

    def _build_gpu_group(self) -> QGroupBox:
        self.model_path = QLineEdit()
        self.model_path.setPlaceholderText("bundled SmolLM2-135M-Instruct")
        browse = QPushButton("Choose…")
        browse.clicked.connect(self._choose_model)
        model_row = QHBoxLayout()
        model_row.addWidget(self.model_path, 1)
        model_row.addWidget(browse)
        self.simulate_vram = QLineEdit()
        self.simulate_vram.setPlaceholderText("empty: use the real GPU")

        self.n_ctx = _spin(1 << 20, "largest that fits")
        self.max_ctx = _spin(1 << 20)
        self.n_parallel = _spin(256)
        self.reserve_percent = QDoubleSpinBox()
        self.reserve_percent.setRange(0, 100)
        self.reserve_percent.setDecimals(1)
        self.reserve_percent.setSuffix(" %")
        self.reserve_min = QLineEdit()
        self.reserve_min.setPlaceholderText("e.g. 256MiB")
        self.cache_type = QComboBox()
        self.cache_type.addItems(["f16", "q8_0", "q4_0"])
        self.flash_attn = QCheckBox("Flash attention (needed for q8_0 and q4_0 caches)")
        gpu = QGroupBox("Model and GPU budget")
        gpu_form = QFormLayout(gpu)
        gpu_form.addRow("Model file", model_row)
        gpu_form.addRow("Simulated GPU memory", self.simulate_vram)
        gpu_form.addRow("Context cap (tokens)", self.n_ctx)
        gpu_form.addRow("Largest context", self.max_ctx)
        gpu_form.addRow("Concurrency", self.n_parallel)
        gpu_form.addRow("Reserve", self.reserve_percent)
        gpu_form.addRow("Minimum reserve", self.reserve_min)
        gpu_form.addRow("KV cache type", self.cache_type)
        gpu_form.addRow("", self.flash_attn)
        return gpu

    def _build_failover_group(self) -> QGroupBox:
        self.fallback = QComboBox()
        for value, label in FALLBACK_CHOICES:
            self.fallback.addItem(label, value)
        self.deadline = _seconds(24 * 3600)
        self.auto_approve = _seconds(24 * 3600, "off")
        failover = QGroupBox("When the GPU fails")
        failover_form = QFormLayout(failover)
        failover_form.addRow("Fallback to CPU", self.fallback)
        failover_form.addRow("Client deadline", self.deadline)
        failover_form.addRow("Auto-approve up to", self.auto_approve)
        return failover

    def _build_restart_banner(self) -> QFrame:
        self.restart_banner = QFrame()
        self.restart_banner.setObjectName("restartBanner")
        self.restart_banner.setStyleSheet(
            "#restartBanner { background: #fff4e6; border: 1px solid #f59f00; border-radius: 6px; }"
        )
        self.restart_text = QLabel("")
        self.restart_text.setWordWrap(True)
        self.restart_button = QPushButton("Restart workers now")
        self.restart_button.clicked.connect(self.restart_workers)
        banner = QHBoxLayout(self.restart_banner)
        banner.addWidget(self.restart_text, 1)
        banner.addWidget(self.restart_button)
        self.restart_banner.hide()
        return self.restart_banner

    def _build_buttons(self) -> QHBoxLayout:
        self.save_button = QPushButton("Save")
        self.save_button.setDefault(True)
        self.save_button.clicked.connect(self.save)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        buttons = QHBoxLayout()
        self.file_label = QLabel(f"<span style='color:#6c757d'>{self.config_path}</span>")
        buttons.addWidget(self.file_label, 1)
        buttons.addWidget(close)
        buttons.addWidget(self.save_button)
        return buttons

    def _choose_model(self) -> None:
        start = self.model_path.text() or str(Path.home())
        path, _filter = QFileDialog.getOpenFileName(
            self, "Choose a GGUF model", start, "GGUF models (*.gguf)"
        )
        if path:
            self.model_path.setText(path)

    def load(self) -> None:
        """Fill the form: from the service's own view of its config file when there is a service (the tray
        never writes the service's file itself), else from the file."""
        if self.client is not None:
            self.save_button.setEnabled(False)  # until the form holds the service's values
            call = self.client.config()
            call.succeeded.connect(self._fill_from_service)
            call.failed.connect(lambda message: self._say(f"Could not read the settings: {message}", True))
            return
        try:
            cfg = config.load(self.config_path)
        except config.ConfigError as error:
            self._say(f"The config file has an error; fix it or save new values: {error}", error=True)
            cfg = config.Config(source=str(self.config_path))
        self._fill(cfg)

    def _fill_from_service(self, answer: object) -> None:
        if not isinstance(answer, dict):
            return
        values = answer.get("file") or answer.get("config") or {}
        try:
            self._fill(config.from_dict(values, source=str(answer.get("source") or "")))
        except config.ConfigError as error:
            self._say(f"The service's config has an error: {error}", error=True)
            return
        self.save_button.setEnabled(True)

    def _fill(self, cfg: config.Config) -> None:
        self.model_path.setText(cfg.model.path)
        self.simulate_vram.setText(cfg.device.simulate_vram)
        self.n_ctx.setValue(cfg.budget.n_ctx)
        self.max_ctx.setValue(cfg.budget.max_ctx)
        self.n_parallel.setValue(cfg.budget.n_parallel)
        self.reserve_percent.setValue(cfg.budget.reserve_percent)
        self.reserve_min.setText(cfg.budget.reserve_min)
        self.cache_type.setCurrentText(cfg.budget.cache_type)
        self.flash_attn.setChecked(cfg.budget.flash_attn)
        self.fallback.setCurrentIndex(max(self.fallback.findData(cfg.failover.fallback), 0))
        self.deadline.setValue(cfg.failover.deadline)
        self.auto_approve.setValue(cfg.failover.auto_approve_seconds)

    def values(self) -> dict[str, dict[str, Any]]:
        return {
            "model": {"path": self.model_path.text().strip()},
            "device": {"simulate_vram": self.simulate_vram.text().strip()},
            "budget": {
                "n_ctx": self.n_ctx.value(),
                "max_ctx": self.max_ctx.value(),
                "n_parallel": self.n_parallel.value(),
                "reserve_percent": float(self.reserve_percent.value()),
                "reserve_min": self.reserve_min.text().strip(),
                "cache_type": self.cache_type.currentText(),
                "flash_attn": self.flash_attn.isChecked(),
            },
            "failover": {
                "fallback": self.fallback.currentData(),
                "deadline": float(self.deadline.value()),
                "auto_approve_seconds": float(self.auto_approve.value()),
            },
        }

    def _check_model(self, path: str) -> str:
        if not path:
            return ""
        file = Path(path).expanduser()
        if not file.is_file():
            return f"model.path: {path} is not a file"
        with file.open("rb") as handle:
            if handle.read(4) != b"GGUF":
                return f"model.path: {path} is not a GGUF model file"
        return ""

    def save(self) -> bool:
        """Validate and save: through the service (`PATCH /failsoft/config`; it writes its file and takes
        the change over, the answer comes later), or to the file when there is no service. False (nothing
        saved, message shown) when a value is refused here."""
        if not self.save_button.isEnabled():
            self._say("The settings are still being read from the service.", error=True)
            return False
        values = self.values()
        problem = self._check_model(values["model"]["path"])
        if problem:
            self._say(f"Not saved: {problem}", error=True)
            return False
        if self.client is not None:
            # The service takes no file paths over HTTP (config.FILE_ONLY): the tray, run by the user,
            # writes those into the file itself; the service reads them with the rest of the change.
            local = {
                section: {key: value for key, value in keys.items() if (section, key) in config.FILE_ONLY}
                for section, keys in values.items()
            }
            try:
                _cfg, written = config.edit_file(self.config_path, {s: k for s, k in local.items() if k})
            except config.ConfigError as error:
                self._say(f"Not saved: {error}", error=True)
                return False
            remote = {
                section: {key: value for key, value in keys.items() if (section, key) not in config.FILE_ONLY}
                for section, keys in values.items()
            }
            call = self.client.change_config(remote)
            call.succeeded.connect(lambda answer: self._saved_by_service(answer, written))
            call.failed.connect(lambda message: self._say(f"Not saved: {message}", error=True))
            return True
        try:
            _cfg, changed = config.edit_file(self.config_path, values)
        except config.ConfigError as error:
            self._say(f"Not saved: {error}", error=True)
            return False
        self._report_saved(changed, needs_restart(changed))
        return True

    def _saved_by_service(self, answer: object, written: list[tuple[str, str]] | None = None) -> None:
        if not isinstance(answer, dict):
            return
        changed = [*(written or []), *(_key(name) for name in answer.get("changed") or [])]
        self._report_saved(changed, [_key(name) for name in answer.get("needs_restart") or []])

    def _report_saved(self, changed: list[tuple[str, str]], restart: list[tuple[str, str]]) -> None:
        if not changed:
            self._say("Nothing changed.")
            return
        self.pending_restart = sorted(set(self.pending_restart) | set(restart))
        self._say(f"Saved {describe(changed)}.")
        self.saved.emit(changed)
        self._show_restart_banner()

    def _show_restart_banner(self) -> None:
        if not self.pending_restart:
            self.restart_banner.hide()
            return
        self.restart_text.setText(
            f"<b>Restart needed</b> for: {describe(self.pending_restart)}. "
            "The workers keep their current settings until they restart; requests in flight finish first."
        )
        self.restart_button.setEnabled(self.client is not None)
        self.restart_banner.show()

    def restart_workers(self) -> None:
        if self.client is None:
            return
        self.restart_button.setEnabled(False)
        self._say("Restarting the workers with the new settings…")
        call = self.client.reload_config(restart=True)
        call.succeeded.connect(self._restarted)
        call.failed.connect(lambda message: self._say(f"Restart failed: {message}", error=True))

    def _restarted(self, answer: object) -> None:
        if isinstance(answer, dict) and answer.get("restarted") is False:
            # The service answered but did not restart: it applies these settings at its next start.
            self.restart_button.setEnabled(True)
            self._say(
                f"The service did not restart its workers; it applies {describe(self.pending_restart)} "
                "when it next starts (quit and start Failsoft, or restart `failsoft serve`).",
                error=True,
            )
            return
        self.pending_restart = []
        self.restart_banner.hide()
        self._say("The workers are restarting with the new settings.")

    def _say(self, text: str, error: bool = False) -> None:
        self.message.setStyleSheet("color: #c92a2a;" if error else "color: #2b8a3e;")
        self.message.setText(text)


def _key(name: str) -> tuple[str, str]:
    section, _, key = str(name).partition(".")
    return section, key
