"""A worker's event line is bounded: a peer that never ends its line is cut off, not buffered."""

from __future__ import annotations

import pytest

from tray_app.jobs import relay
from tray_app.jobs.relay import UpstreamError


def test_whole_lines_and_the_unfinished_rest() -> None:
    assert relay._lines(b'data: {"a": 1}\n\ndata: {"b"') == [b'data: {"a": 1}', b"", b'data: {"b"']


def test_an_endless_line_fails_the_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay, "MAX_EVENT_BYTES", 16)
    assert relay._lines(b"data: " + b"x" * 10)  # within the bound
    with pytest.raises(UpstreamError) as failed:
        relay._lines(b"data: " + b"x" * 11)
    assert failed.value.kind == "exited" and "over 16 bytes" in failed.value.message
