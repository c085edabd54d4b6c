"""llama.cpp's log in the Failsoft process: captured where a caller reads it, otherwise Python logging at
the level llama.cpp gave (llama-cpp-python's own callback maps an older numbering of ggml's levels)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tray_app.engine import llama_log
from tray_app.tokenizer.counter import TokenCounter


def test_levels_follow_ggml_and_a_continuation_keeps_its_message_level(
    caplog: pytest.LogCaptureFixture,
) -> None:
    forward = llama_log._Forward()
    with caplog.at_level(logging.DEBUG, logger="llama.cpp"):
        forward(3, "llama_context: a warning\n")
        forward(4, "gguf: an error")
        forward(5, " that goes on\n")
        forward(2, "load_tensors: a load report line\n")
        forward(1, "\n")  # nothing to say: no record
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "llama_context: a warning"),
        (logging.ERROR, "gguf: an error"),
        (logging.ERROR, "that goes on"),
        (logging.DEBUG, "load_tensors: a load report line"),
    ]


def test_the_token_counter_loads_quietly_and_later_warnings_are_logged(
    model_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    import llama_cpp

    TokenCounter(model_path)
    assert "n_ctx_train" not in capfd.readouterr().err  # the vocab-only load's warning was captured
    with caplog.at_level(logging.WARNING, logger=llama_log.log.name):
        llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)  # outside any capture
    assert "n_ctx_train" not in capfd.readouterr().err
    warnings = [
        r.getMessage() for r in caplog.records if r.name == "llama.cpp" and r.levelno == logging.WARNING
    ]
    assert any("n_ctx_seq (512) > n_ctx_train (0)" in message for message in warnings), caplog.records


def test_a_model_that_cannot_load_says_why(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="invalid magic characters"):
        TokenCounter(broken)
