"""`failsoft doctor`: what this machine offers Failsoft, what is missing, and the command that fixes it.

Exit status 1 when something blocks running (no engine binary, the model missing, the port taken), else 0.
"""

from __future__ import annotations

import argparse
import json

from tray_app import config
from tray_app.doctor.checks import Check, run_checks

_MARK = {"ok": "ok", "info": "--", "warn": "!!", "blocking": "XX"}


def render(checks: list[Check]) -> str:
    lines = []
    for check in checks:
        lines.append(f"[{_MARK[check.level]}] {check.name:<13} {check.summary}")
        if check.fix:
            lines.append(f"     {'':<13} fix: {check.fix}")
    blocking = [check.name for check in checks if check.level == "blocking"]
    lines.append("")
    lines.append(f"blocking: {', '.join(blocking)}" if blocking else "nothing blocks running Failsoft")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    checks = run_checks(config.load_config(args))
    blocked = any(check.level == "blocking" for check in checks)
    if args.json:
        body = {"ok": not blocked, "checks": [check.to_dict() for check in checks]}
        print(json.dumps(body, indent=2))
    else:
        print(render(checks))
    return 1 if blocked else 0
