"""One owner per piece of state (issue 15), checked on the source: only the job registry assigns a job's
fields, only the attempt stamps a stream's path, only the CPU speed meter writes the measured CPU speed, and
only the service's composition root replaces the running config."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import tray_app
from tray_app.jobs.registry import Job

PACKAGE = Path(tray_app.__file__).parent
# Who may assign each of a job's fields: the registry every field but the task that runs the job, which the
# jobs facade alone starts (jobs/intake.py). Built from the dataclass, so a new field is covered too.
OWNERS = {
    field.name: "jobs/intake.py" if field.name == "task" else "jobs/registry.py"
    for field in dataclasses.fields(Job)
}
JOB_FIELD_WRITE = re.compile(r"\b(?:job|self)\.(" + "|".join(OWNERS) + r")\s*(?::[^=]*)?=(?!=)")
# The stream's first-token stamps: the first attempt's own record (jobs.path_timing), written by it alone.
PATH_STAMP = re.compile(r"\bjob\.path\.\w+\s*=(?!=)")
# The measured CPU speed (worker_port.CpuSpeed): its recording methods, called by its meter alone.
CPU_SPEED_WRITE = re.compile(
    r"\.record_prompt\(|speed\.record\(|\.(prompt_)?(tokens_per_second|samples)\s*[-+]?=(?!=)"
)
CONFIG_WRITE = re.compile(r"\b(svc|service|self)\.cfg(\.\w+)*\s*=(?!=)|setattr\(\s*(self\.)?(svc\.)?cfg\b")


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_each_of_a_jobs_fields_has_one_writer() -> None:
    strangers = []
    for path in sources():
        where = str(path.relative_to(PACKAGE))
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in JOB_FIELD_WRITE.finditer(line):
                if match.group(0).startswith("self.") and where != "jobs/registry.py":
                    continue  # another class's attribute of the same name
                if OWNERS[match.group(1)] != where:
                    strangers.append(f"{where}:{number}: {line.strip()}")
    assert strangers == []
    assert "task" in OWNERS and "path" in OWNERS  # the fields the old check missed


def test_the_first_token_stamps_are_written_by_the_attempt_alone() -> None:
    writers = {
        str(path.relative_to(PACKAGE))
        for path in sources()
        for line in path.read_text().splitlines()
        if PATH_STAMP.search(line)
    }
    assert writers <= {"jobs/attempt.py"}


def test_the_cpu_speed_is_written_by_its_meter_alone() -> None:
    writers = {
        str(path.relative_to(PACKAGE))
        for path in sources()
        for line in path.read_text().splitlines()
        if CPU_SPEED_WRITE.search(line)
    }
    assert writers == {"jobs/cpu_speed_meter.py", "jobs/worker_port.py"}  # the meter; CpuSpeed's own methods


def test_only_the_service_replaces_the_running_config() -> None:
    writers = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in sources()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if CONFIG_WRITE.search(line)
    ]
    owner = [w for w in writers if w.startswith("host/service.py") or w.startswith("host/thread.py")]
    assert writers == owner and owner, writers
