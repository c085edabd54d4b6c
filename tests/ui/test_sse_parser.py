"""Server-sent events arrive in arbitrary pieces; the parser must give whole messages."""

from __future__ import annotations

from tray_app.ui.api_client import SseMessage, SseParser, error_message

STREAM = (
    b": keep-alive\n\n"
    b'event: worker_state\ndata: {"role": "gpu", "new": "ready"}\n\n'
    b'event: approval_needed\r\ndata: {"preview": "caf\xc3\xa9"}\r\n\r\n'
    b"data: [DONE]\n\n"
)


def test_whole_stream_gives_each_message_once() -> None:
    messages = SseParser().feed(STREAM)
    assert messages == [
        SseMessage("worker_state", '{"role": "gpu", "new": "ready"}'),
        SseMessage("approval_needed", '{"preview": "café"}'),
        SseMessage("message", "[DONE]"),
    ]


def test_byte_by_byte_gives_the_same_messages() -> None:
    parser = SseParser()
    messages = []
    for index in range(len(STREAM)):
        messages += parser.feed(STREAM[index : index + 1])
    assert messages == SseParser().feed(STREAM)


def test_multi_line_data_is_joined() -> None:
    assert SseParser().feed(b"data: a\ndata: b\n\n") == [SseMessage("message", "a\nb")]


def test_error_message_reads_openai_errors() -> None:
    body = b'{"error": {"message": "queue full", "type": "x", "param": null, "code": "queue_full"}}'
    assert error_message(body, 429, "transport") == "queue full"
    assert error_message(b"oops", 502, "transport") == "HTTP 502: oops"
    assert error_message(b"", None, "Connection refused") == "Connection refused"
