#!/usr/bin/env python3
"""`make install` and `make uninstall`: this checkout's Failsoft for this user (the command on PATH, the menu
entry and icon, the systemd user unit, the tray at login). The work is `tray_app/install/user.py` (standard
library only), which an installed Failsoft runs as `failsoft install --user`.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tray_app.install.user import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(default_venv=REPO / ".venv"))
