"""The drill report: one object, shown as a terminal table, a Markdown file and a JSON file."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tray_app.contract.sizes import format_size
from tray_app.drill.records import ScenarioRecord, verdict


@dataclass
class DrillReport:
    started_at: float
    service: dict[str, Any]  # url, launched, simulated, device, model, engine, caps, policy
    scenarios: list[ScenarioRecord] = field(default_factory=list)
    pressure: dict[str, Any] | None = None
    seconds: float = 0.0

    def judge(self) -> None:
        for record in self.scenarios:
            record.problems = verdict(record)

    @property
    def failed(self) -> list[ScenarioRecord]:
        return [record for record in self.scenarios if record.problems]

    def to_dict(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at,
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_at)),
            "seconds": round(self.seconds, 1),
            "service": self.service,
            "scenarios": [record.to_dict() for record in self.scenarios],
            "pressure": self.pressure,
            "passed": not self.failed,
            "failures": {record.key: record.problems for record in self.failed},
        }


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _connection(record: ScenarioRecord) -> str:
    if record.connection_survived is None:
        return "closed*"
    return "yes" if record.connection_survived else "NO"


def _error(record: ScenarioRecord) -> str:
    if record.first_error_kind is None:
        return "-"
    return f"{record.first_error_kind} @{record.first_error_at:.2f}s"


def _row(record: ScenarioRecord) -> list[str]:
    if record.skipped:
        return [record.key, record.title, "skipped", "", "", "", "", "", "", "", ""]
    tools = f"{record.tool_executions}/{record.tool_calls_intended}" if record.tool_calls_intended else "-"
    same = {None: "", True: " (=)", False: " (differs)"}[record.same_as_unfaulted]
    return [
        record.key,
        record.title,
        "ok" if not record.problems else "FAIL",
        record.actual,
        record.answered_by or "-",
        _error(record),
        _seconds(record.cpu_started_at),
        _seconds(record.total_seconds),
        _connection(record),
        tools,
        f"{record.output_head[:40]}{same} #{record.output_sha256[:10]}",
    ]


HEADER = [
    "#",
    "scenario",
    "result",
    "decision (route, reason -> state)",
    "answered by",
    "first error",
    "CPU start",
    "total",
    "conn",
    "tools",
    "answer (first words, sha256)",
]


def table(report: DrillReport) -> str:
    rows = [HEADER, *(_row(record) for record in report.scenarios)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _service_line(service: dict[str, Any]) -> str:
    device = service.get("device") or {}
    label = " [SIMULATED]" if service.get("simulated") else ""
    caps = service.get("caps") or {}
    origin = "started by the drill" if service.get("launched") else "already running"
    engine = service.get("engine") or {}
    return (
        f"service {service.get('url')} ({origin}); model {service.get('model')}; "
        f"engine llama-server {engine.get('version')} (llama.cpp commit {engine.get('commit')}); "
        f"GPU {device.get('name')} {format_size(int(device.get('total_bytes') or 0))}{label}; "
        f"GPU profile {caps.get('n_ctx_per_seq')} tokens per sequence, CPU profile {caps.get('cpu_n_ctx')}"
    )


def _details(record: ScenarioRecord) -> list[str]:
    if record.skipped:
        return [f"{record.key}) skipped: {record.skipped}"]
    lines = [
        f"{record.key}) {record.title}",
        f"   expected {record.expected}; got {record.actual}",
        f"   why: {record.decision_why or '-'}",
    ]
    if record.answered_by or record.expected_answerer:
        expected = f" (expected {record.expected_answerer})" if record.expected_answerer else ""
        lines.append(f"   answered by {record.answered_by or 'nobody'}{expected}")
    if record.first_error_kind:
        lines.append(f"   first error {_error(record)}: {record.first_error_message}")
    lines.append(f"   jobs {', '.join(record.job_ids) or '-'}; answer sha256 {record.output_sha256}")
    lines += [f"   note: {note}" for note in record.notes]
    lines += [f"   PROBLEM: {problem}" for problem in record.problems]
    return lines


def pressure_lines(pressure: dict[str, Any]) -> list[str]:
    lines = [f"memory pressure: {pressure.get('size')} ({pressure.get('mode')})"]
    if pressure.get("error"):
        lines.append(f"   {pressure['error']}")
    for key in ("torch_during", "torch_after"):
        if key in pressure:
            torch_numbers = pressure[key]
            lines.append(
                f"   torch {key.split('_')[1]}: allocated {format_size(torch_numbers['allocated_bytes'])}, "
                f"reserved {format_size(torch_numbers['reserved_bytes'])}"
            )
    lines += [f"   {line}" for line in pressure.get("summary") or []]
    return lines


def text(report: DrillReport) -> str:
    lines = [_service_line(report.service), ""]
    if report.pressure is not None:
        lines += [*pressure_lines(report.pressure), ""]
    if report.scenarios:
        lines += [
            table(report),
            "",
            "conn: the client's connection ended normally (closed*: closed by the "
            "client on purpose); tools: executions/intended calls; (=): same answer as a run without "
            "faults; answered by: the model and device that answered (a stand-in says for which model)",
            "",
        ]
        for record in report.scenarios:
            lines += _details(record)
    return "\n".join(lines)


def markdown(report: DrillReport) -> str:
    data = report.to_dict()
    lines = [f"# Failsoft drill, {data['started']}", "", _service_line(report.service), ""]
    if report.pressure is not None:
        lines += [
            "## Memory pressure",
            "",
            *(f"- {line.strip()}" for line in pressure_lines(report.pressure)),
            "",
        ]
    if report.scenarios:
        lines += ["## Scenarios", "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        for record in report.scenarios:
            cells = [cell.replace("|", "\\|") for cell in _row(record)]
            lines.append("| " + " | ".join(cells) + " |")
        lines += [
            "",
            "## Details",
            "",
            "```",
            *(line for r in report.scenarios for line in _details(r)),
            "```",
        ]
    verdict_line = (
        "PASSED"
        if not report.failed
        else "FAILED: " + "; ".join(f"{record.key}: {', '.join(record.problems)}" for record in report.failed)
    )
    lines += ["", f"**{verdict_line}**", ""]
    return "\n".join(lines)


def write(report: DrillReport, directory: Path) -> tuple[Path, Path]:
    """Write `drill-<time>.json` and `.md` into `directory`; returns both paths."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(report.started_at))
    json_path = directory / f"drill-{stamp}.json"
    md_path = directory / f"drill-{stamp}.md"
    json_path.write_text(json.dumps(report.to_dict(), indent=2), encoding="utf-8")
    md_path.write_text(markdown(report), encoding="utf-8")
    return json_path, md_path
