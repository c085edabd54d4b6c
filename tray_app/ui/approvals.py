"""The approvals window: jobs that would need a slow CPU run wait here for a person's yes or no."""

from __future__ import annotations

import logging
import time

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QHideEvent, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDoubleSpinBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from tray_app.ui.api_client import ServiceClient
from tray_app.ui.icons import app_icon
from tray_app.ui.qt_events import QtEventBridge
from tray_app.view.pending import PendingJob, pending_jobs
from tray_app.view.state import format_duration

log = logging.getLogger(__name__)

COLUMNS = ("Waiting", "CPU time (est.)", "Or now on the GPU", "Prompt", "Job")
PROMPT_COLUMN, JOB_COLUMN = 3, 4


class ApprovalsWindow(QWidget):
    """Queued jobs with their estimated CPU time, prompt and age; approve, reject, approve all."""

    jobs_changed = Signal(int)

    def __init__(self, client: ServiceClient, bridge: QtEventBridge) -> None:
        super().__init__()
        self.client = client
        self.jobs: list[PendingJob] = []
        self.setWindowTitle("Failsoft — Approvals")
        self.setWindowIcon(app_icon())
        self.resize(760, 380)

        self.heading = QLabel()
        self.heading.setStyleSheet("font-size: 15px; font-weight: 600;")
        explain = QLabel(
            "These jobs could not run on the GPU and would take a while on the CPU worker. "
            "Approved jobs run on the CPU in order; rejected ones end with an error to their client. "
            'Where a smaller model can answer on the GPU now, "Smaller model now" runs the job on it '
            "(its answer names the model that answered)."
        )
        explain.setWordWrap(True)
        explain.setStyleSheet("color: #495057;")
        self.message = QLabel("")
        self.message.setWordWrap(True)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 14, 16, 14)
        layout.setSpacing(10)
        layout.addWidget(self.heading)
        layout.addWidget(explain)
        layout.addWidget(self._build_table(), 1)
        layout.addLayout(self._build_buttons())
        layout.addLayout(self._build_threshold())
        layout.addWidget(self.message)

        self._ages = QTimer(self)
        self._ages.setInterval(1000)
        self._ages.timeout.connect(self._update_ages)
        self._reload = QTimer(self)
        self._reload.setSingleShot(True)
        self._reload.setInterval(200)
        self._reload.timeout.connect(self.refresh)
        bridge.approval_needed.connect(lambda _event: self._reload.start())
        bridge.job_state.connect(lambda _event: self._reload.start())
        self._load_threshold()
        self._show_jobs([])

    def _build_table(self) -> QTableWidget:
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(PROMPT_COLUMN, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(JOB_COLUMN, QHeaderView.ResizeMode.ResizeToContents)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        return self.table

    def _build_buttons(self) -> QHBoxLayout:
        self.approve_button = QPushButton("Approve")
        self.stand_in_button = QPushButton("Smaller model now")
        self.stand_in_button.setToolTip(
            "Answer with the smaller model on the GPU now instead of waiting for the CPU"
        )
        self.stand_in_button.clicked.connect(lambda: self._act_on_selected("stand-in"))
        self.reject_button = QPushButton("Reject")
        self.approve_all_button = QPushButton("Approve all")
        self.approve_button.setDefault(True)
        self.approve_button.clicked.connect(lambda: self._act_on_selected("approve"))
        self.reject_button.clicked.connect(lambda: self._act_on_selected("reject"))
        self.approve_all_button.clicked.connect(self.approve_all)
        buttons = QHBoxLayout()
        buttons.addWidget(self.approve_button)
        buttons.addWidget(self.stand_in_button)
        buttons.addWidget(self.reject_button)
        buttons.addStretch(1)
        buttons.addWidget(self.approve_all_button)
        return buttons

    def _build_threshold(self) -> QHBoxLayout:
        self.threshold = QDoubleSpinBox()
        self.threshold.setRange(0, 24 * 3600)
        self.threshold.setDecimals(0)
        self.threshold.setSuffix(" s")
        self.threshold.setSpecialValueText("off")
        self.threshold.setToolTip("Jobs estimated at most this long on the CPU are approved without asking.")
        self.save_threshold = QPushButton("Save")
        self.save_threshold.clicked.connect(self.save_auto_approve)
        auto = QHBoxLayout()
        auto.addWidget(QLabel("Approve automatically when the CPU needs at most"))
        auto.addWidget(self.threshold)
        auto.addWidget(self.save_threshold)
        auto.addStretch(1)
        return auto

    # data
    def refresh(self) -> None:
        call = self.client.awaiting_approval()
        call.succeeded.connect(lambda answer: self._show_jobs(pending_jobs(answer)))
        call.failed.connect(lambda message: self._say(f"Could not load the jobs: {message}", error=True))

    def _show_jobs(self, jobs: list[PendingJob]) -> None:
        selected = set(self.selected_job_ids())
        self.jobs = jobs
        self.table.setRowCount(len(jobs))
        for row, job in enumerate(jobs):
            cells = (
                format_duration(time.time() - job.created_at),
                format_duration(job.estimated_seconds) if job.estimated_seconds else "unknown",
                job.stand_in or "—",
                " ".join(job.preview.split())[:200],
                job.job_id.removeprefix("job-")[:10],
            )
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if column == 2:
                    item.setToolTip(job.choice())
                if column == PROMPT_COLUMN:
                    item.setToolTip(job.preview)
                if column == JOB_COLUMN:
                    item.setToolTip(job.job_id)
                if column in (0, 1):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(row, column, item)
            if job.job_id in selected:
                self.table.selectRow(row)
        if jobs and not self.table.selectedItems():
            self.table.selectRow(0)
        count = len(jobs)
        self.heading.setText(
            "Nothing waits for approval"
            if not count
            else ("1 job waits for approval" if count == 1 else f"{count} jobs wait for approval")
        )
        self._update_buttons()
        self.jobs_changed.emit(count)

    def _update_ages(self) -> None:
        for row, job in enumerate(self.jobs):
            item = self.table.item(row, 0)
            if item is not None:
                item.setText(format_duration(time.time() - job.created_at))

    def selected_job_ids(self) -> list[str]:
        rows = sorted({index.row() for index in self.table.selectedIndexes()})
        return [self.jobs[row].job_id for row in rows if row < len(self.jobs)]

    def _update_buttons(self) -> None:
        selected = set(self.selected_job_ids())
        has_selection = bool(selected)
        self.approve_button.setEnabled(has_selection)
        offers = [job for job in self.jobs if job.job_id in selected and job.stand_in]
        self.stand_in_button.setEnabled(bool(offers))
        self.stand_in_button.setToolTip(
            offers[0].choice() if offers else "No smaller model can answer the selected job on the GPU"
        )
        self.reject_button.setEnabled(has_selection)
        self.approve_all_button.setEnabled(bool(self.jobs))

    # actions
    def _act_on_selected(self, action: str) -> None:
        offered = {job.job_id for job in self.jobs if job.stand_in}
        for job_id in self.selected_job_ids():
            if action == "stand-in" and job_id not in offered:
                continue
            call = self.client.job_action(job_id, action)
            verb = {"approve": "Approved", "reject": "Rejected", "stand-in": "Smaller model answers"}[action]
            call.succeeded.connect(
                lambda _answer, job_id=job_id, verb=verb: self._done(f"{verb} job {job_id}.")
            )
            call.failed.connect(
                lambda message, job_id=job_id: self._say(f"Job {job_id}: {message}", error=True)
            )

    def approve_all(self) -> None:
        call = self.client.approve_all()
        call.succeeded.connect(lambda _answer: self._done("Approved all waiting jobs."))
        call.failed.connect(lambda message: self._say(f"Approve all failed: {message}", error=True))

    def _done(self, text: str) -> None:
        self._say(text)
        self.refresh()

    def _say(self, text: str, error: bool = False) -> None:
        self.message.setStyleSheet("color: #c92a2a;" if error else "color: #2b8a3e;")
        self.message.setText(text)

    # the auto-approve threshold: the service's setting, read and changed through its API
    def _load_threshold(self) -> None:
        call = self.client.config()
        call.succeeded.connect(self._show_threshold)
        call.failed.connect(lambda message: self._say(f"Could not read the settings: {message}", True))

    def _show_threshold(self, answer: object) -> None:
        if isinstance(answer, dict):
            self.threshold.setValue(float(answer["config"]["failover"]["auto_approve_seconds"]))

    def save_auto_approve(self) -> None:
        change = {"failover": {"auto_approve_seconds": float(self.threshold.value())}}
        call = self.client.change_config(change)
        call.succeeded.connect(self._threshold_saved)
        call.failed.connect(lambda message: self._say(f"Not saved: {message}", error=True))

    def _threshold_saved(self, answer: object) -> None:
        changed = answer.get("changed") if isinstance(answer, dict) else None
        if changed:
            self._say("Saved; the service uses the new threshold now.")
        else:
            self._say("The threshold is unchanged.")

    # window life
    def showEvent(self, event: QShowEvent) -> None:
        self.refresh()
        self._load_threshold()
        self._ages.start()
        super().showEvent(event)

    def hideEvent(self, event: QHideEvent) -> None:
        self._ages.stop()
        super().hideEvent(event)
