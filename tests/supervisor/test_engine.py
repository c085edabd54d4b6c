"""The engine's pure parts and its binary check: a user's own llama-server is read for its version and
refused, with the flag named, when it lacks one Failsoft passes; how tool_choice is worded for it."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.support.fake_worker import fake_llama_server
from tray_app.budget.model_info import inspect_model
from tray_app.engine import binary
from tray_app.engine.thinking import model_thinks, template_thinks
from tray_app.engine.tools import (
    CHATML_TOOL_CALL_CLOSER,
    CHATML_TOOL_CALL_OPENER,
    CHATML_TOOLS_TEMPLATE,
    template_for,
    tool_call_opener,
    worker_tool_choice,
    workers_template,
)

VERSION_TEXT = "version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with GNU 12.2.0 for Linux x86_64\n"
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
SUB = {"type": "function", "function": {"name": "sub", "parameters": {"type": "object"}}}
ASK = [{"role": "user", "content": "2 + 3?"}]


def fake_server(tmp_path: Path, flags: list[str], version: str = VERSION_TEXT) -> Path:
    """A stand-in binary that answers --version and --help the way llama-server does."""
    help_text = "\n".join(f"{flag} N    something" for flag in flags)
    script = tmp_path / "llama-server"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = --version ]; then printf %s "{version}" >&2; exit 0; fi\n'
        f"cat <<'EOF'\n{help_text}\nEOF\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_the_bundled_server_is_found_and_reads_its_commit() -> None:
    info = binary.find("")
    assert info.path == binary.bundled_server() and info.path.name == "llama-server"
    assert info.commit and info.version and info.describe().startswith("llama-server ")
    assert not binary.missing_flags(info.flags)


def test_a_users_build_is_used_when_configured(tmp_path: Path) -> None:
    info = binary.find(str(fake_server(tmp_path, list(binary.REQUIRED_FLAGS))))
    assert (info.version, info.build, info.commit) == ("0.5.0-dev", 1, "0c1e570")


def test_a_build_without_a_needed_flag_is_refused_by_name(tmp_path: Path) -> None:
    flags = [flag for flag in binary.REQUIRED_FLAGS if flag not in ("--fit", "--jinja")]
    with pytest.raises(binary.EngineError, match=r"lacks flags Failsoft needs: --fit, --jinja"):
        binary.find(str(fake_server(tmp_path, flags)))


def test_something_else_than_llama_server_is_refused(tmp_path: Path) -> None:
    with pytest.raises(binary.EngineError, match="does not look like llama-server"):
        binary.find(str(fake_server(tmp_path, list(binary.REQUIRED_FLAGS), version="hello")))
    with pytest.raises(binary.EngineError, match="no such file"):
        binary.find(str(tmp_path / "nowhere"))


def test_a_chatml_model_without_tools_gets_the_tool_template() -> None:
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}"
    assert template_for(chatml, "") == str(CHATML_TOOLS_TEMPLATE)
    assert template_for(chatml + "{% if tools %}{% endif %}", "") == ""  # its own knows tools
    assert template_for("[INST] {{ m }} [/INST]", "") == ""  # not chatml: its own
    assert template_for(chatml, "llama3") == "llama3"  # the config wins
    assert tool_call_opener(str(CHATML_TOOLS_TEMPLATE)) == CHATML_TOOL_CALL_OPENER
    assert tool_call_opener("") == ""


def test_a_named_choice_is_required_with_only_that_tool() -> None:
    body = {
        "messages": ASK,
        "tools": [ADD, SUB],
        "tool_choice": {"type": "function", "function": {"name": "sub"}},
    }
    sent = worker_tool_choice(body, CHATML_TOOL_CALL_OPENER)
    assert sent["tool_choice"] == "required" and sent["tools"] == [SUB]
    assert sent["messages"][-1] == {"role": "assistant", "content": CHATML_TOOL_CALL_OPENER}
    assert sent["parallel_tool_calls"] is False and sent["stop"] == [CHATML_TOOL_CALL_CLOSER]
    assert body["tools"] == [ADD, SUB] and body["messages"] == ASK  # the client's request is not changed


def test_required_keeps_the_clients_stops_and_may_allow_parallel_calls() -> None:
    body = {"messages": ASK, "tools": [ADD], "tool_choice": "required", "stop": "\n\n"}
    assert worker_tool_choice(body, CHATML_TOOL_CALL_OPENER)["stop"] == ["\n\n", CHATML_TOOL_CALL_CLOSER]
    parallel = worker_tool_choice({**body, "parallel_tool_calls": True}, CHATML_TOOL_CALL_OPENER)
    assert parallel["stop"] == "\n\n" and parallel["parallel_tool_calls"] is True
    # A model with its own tool template: no prefill, no stop; the choice still goes as llama-server takes it.
    own = worker_tool_choice(body, "")
    assert own["messages"] == ASK and own["stop"] == "\n\n" and own["tool_choice"] == "required"


def test_auto_none_and_no_tools_go_unchanged() -> None:
    for choice in ("auto", "none", None):
        body = {"messages": ASK, "tools": [ADD], "tool_choice": choice}
        assert worker_tool_choice(body, CHATML_TOOL_CALL_OPENER) is body
    plain = {"messages": ASK}
    assert worker_tool_choice(plain, CHATML_TOOL_CALL_OPENER) is plain


def test_the_fast_tiers_fake_llama_server_passes_the_same_check(tmp_path: Path) -> None:
    """tests/support/fake_llama_server.py must keep answering like llama-server (every flag Failsoft
    passes), or the fast tier would test a service that refuses to start."""
    info = binary.find(str(fake_llama_server(tmp_path)))
    assert info.commit == "fake000" and not binary.missing_flags(info.flags)


def test_a_model_thinks_when_its_workers_template_opens_a_reasoning_block(
    model_path: Path, tmp_path: Path
) -> None:
    thinking = Path(__file__).parent.parent / "support" / "thinking-chatml.jinja"
    template = inspect_model(model_path).chat_template
    assert model_thinks(template, str(thinking))
    assert not model_thinks(template, "")  # SmolLM2's own template (the bundled tool template) does not
    assert not model_thinks(template, "chatml")
    assert not model_thinks(template, str(tmp_path / "missing.jinja"))
    assert template_thinks("{% if enable_thinking %}{% endif %}")
    assert template_thinks("<|start|>assistant<|channel|>analysis<|message|>")  # gpt-oss
    assert template_thinks("{{ content.split('</think>')[-1] }}")  # a DeepSeek-R1 distill
    assert not template_thinks(CHATML_TOOLS_TEMPLATE.read_text())


def test_the_router_renders_the_template_its_workers_render(tmp_path: Path) -> None:
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}"
    assert workers_template(chatml, "") == CHATML_TOOLS_TEMPLATE.read_text()  # picked for a chatml model
    own = "[INST] {{ m }} [/INST]"
    assert workers_template(own, "") == own
    mine = tmp_path / "mine.jinja"
    mine.write_text("{{ messages[0].content }}")
    assert workers_template(own, str(mine)) == "{{ messages[0].content }}"
    assert workers_template(own, "chatml") == own  # a built-in by name: the model's own stands in
