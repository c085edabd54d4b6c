"""The service survives what it supervises (a real `failsoft serve`, real workers, the real tokenizer
helper): no native inference code is mapped into the service's process after chats that use every native
parser (a grammar, a JSON schema, tools) and an embedding; a tokenizer helper killed mid-request costs that
request one retry, not the service; and a service that crashed says so when it is started again."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.helpers import base_settings, client_for, wait_until
from tests.support.service import running_service

pytestmark = pytest.mark.integration

NATIVE_INFERENCE = ("libllama", "libggml", "libcuda", "llama_cpp")


def native_libraries(pid: int) -> list[str]:
    """The native inference libraries mapped into process `pid` (none is the point)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return sorted(
        {line.split()[-1] for line in maps.splitlines() if any(n in line for n in NATIVE_INFERENCE)}
    )


def test_no_native_inference_code_runs_in_the_service(tmp_path: Path) -> None:
    with running_service(tmp_path, simulate_vram="2GiB", settings=base_settings()) as svc:
        client = client_for(svc)
        grammar = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "Yes or no?"}],
            max_tokens=4,
            extra_body={"grammar": 'root ::= "yes" | "no"'},
        )
        assert grammar.choices[0].message.content in ("yes", "no")
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        shaped = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "A number."}],
            max_tokens=16,
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        )
        assert shaped.choices[0].message.content
        tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
        called = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "What time is it?"}],
            max_tokens=32,
            tools=[tool],  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )
        assert called.choices[0].message.tool_calls
        assert client.embeddings.create(model="default", input="The sea is blue.").data[0].embedding
        rejected = httpx.post(
            svc.v1 + "/chat/completions",
            json={
                "model": "default",
                "messages": [{"role": "user", "content": "x"}],
                "grammar": "root ::= (",
            },
            timeout=30,
        )
        assert rejected.status_code == 400 and "not valid GBNF" in rejected.text  # the parser's verdict
        status = svc.status()
        assert status["service"]["pid"] == svc.process.pid
        assert native_libraries(svc.process.pid) == []
        helper = status["tokenizer"]["pid"]
        assert any("libllama" in name or "llama_cpp" in name for name in native_libraries(helper))


def test_a_tokenizer_helper_killed_mid_request_costs_that_request_a_retry(tmp_path: Path) -> None:
    with running_service(tmp_path, simulate_vram="2GiB", settings=base_settings()) as svc:
        first = svc.status()["tokenizer"]["pid"]
        client = client_for(svc)
        long_prompt = "the river ran past the old mill and on to the sea; " * 40_000  # 2 MiB: a second or so
        answers: list[object] = []

        def ask() -> None:
            try:
                answers.append(
                    client.chat.completions.create(
                        model="default", messages=[{"role": "user", "content": long_prompt}], max_tokens=2
                    )
                )
            except openai.APIError as error:
                answers.append(error)

        asking = threading.Thread(target=ask)
        asking.start()
        time.sleep(0.5)  # the body is sent and being counted
        os.kill(first, signal.SIGKILL)
        asking.join(120)
        # The count went to the new helper once: the request got an answer (here: too long for any slot),
        # not a dropped connection or a 500.
        assert len(answers) == 1
        answer = answers[0]
        assert isinstance(answer, openai.BadRequestError), answer
        assert answer.code == "context_length_exceeded", answer.body
        # Started again by itself, whether or not the request was still being counted when it died.
        status = wait_until(
            lambda: (s := svc.status())["tokenizer"]["pid"] not in (None, first) and s, 30, "a new helper"
        )
        assert status["tokenizer"]["last_exit"]["signal"] == signal.SIGKILL
        short = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert short.choices[0].message.content is not None
        assert svc.process.poll() is None


@pytest.mark.parametrize("fatal", [signal.SIGSEGV, signal.SIGKILL])
def test_a_service_started_after_a_crash_says_so(tmp_path: Path, fatal: signal.Signals) -> None:
    data = tmp_path / "data"
    with running_service(
        tmp_path / "first", simulate_vram="2GiB", data_dir=data, settings=base_settings()
    ) as svc:
        crashed = svc.process.pid
        os.kill(crashed, fatal)
        svc.process.wait(30)
        assert svc.process.returncode == -fatal
    with running_service(
        tmp_path / "second", simulate_vram="2GiB", data_dir=data, settings=base_settings()
    ) as svc:
        note = svc.status()["service"]["restarted_after_crash"]
        assert note is not None and note["pid"] == crashed
        if fatal == signal.SIGSEGV:
            # faulthandler named the signal and left the Python stack of every thread in the crash log.
            assert note["signal"] == 11
            stack = Path(note["stack_log"]).read_text()
            assert "Fatal Python error: Segmentation fault" in stack and "File " in stack
            output = wait_until(lambda: "the crashed run's stack" in svc.output() and svc.output(), 10)
            assert "Segmentation fault" in str(output)
        else:
            assert note["signal"] is None and note["stack_log"] is None  # SIGKILL leaves no stack
        text = httpx.get(svc.base_url + "/failsoft/status", headers=svc.headers(), timeout=10).json()
        assert text["service"]["pid"] == svc.process.pid
    # A clean stop (SIGTERM) leaves nothing to report at the next start.
    with running_service(
        tmp_path / "third", simulate_vram="2GiB", data_dir=data, settings=base_settings()
    ) as svc:
        assert svc.status()["service"]["restarted_after_crash"] is None
