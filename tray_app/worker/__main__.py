import os
import sys

from tray_app.worker.main import main

try:
    code = main()
except SystemExit as exit_request:  # argparse errors, uvicorn failing to bind
    code = exit_request.code if isinstance(exit_request.code, int) else 1
sys.stdout.flush()
sys.stderr.flush()
# Skip interpreter teardown: llama.cpp threads and finalisers may still be running, and nothing needs it.
os._exit(code)
