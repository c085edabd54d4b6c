"""One owner per piece of state (issue 15), checked on the source: only the job registry assigns a job's
fields, and only the service's composition root replaces the running config."""

from __future__ import annotations

import re
from pathlib import Path

import tray_app

PACKAGE = Path(tray_app.__file__).parent
JOB_FIELD_WRITE = re.compile(
    r"\bjob\.(state|route|worker|attempts|fallback_reason|error|result|estimated_seconds|deadline"
    r"|effects_delivered|body)\s*=(?!=)"
)
CONFIG_WRITE = re.compile(r"\b(svc|service|self)\.cfg(\.\w+)*\s*=(?!=)|setattr\(\s*(self\.)?(svc\.)?cfg\b")


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_only_the_registry_writes_a_jobs_fields() -> None:
    writers = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in sources()
        if path.name != "registry.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if JOB_FIELD_WRITE.search(line)
    ]
    assert writers == []


def test_only_the_service_replaces_the_running_config() -> None:
    writers = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in sources()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if CONFIG_WRITE.search(line)
    ]
    owner = [w for w in writers if w.startswith("host/service.py") or w.startswith("host/thread.py")]
    assert writers == owner and owner, writers
