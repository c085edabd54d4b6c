"""Ask llama.cpp's own parser whether a GBNF grammar is valid, without generating anything.

The router checks a request's grammar at the door with this: a grammar llama.cpp cannot parse is a 400
that quotes the parser, before any worker is asked (llama-server would refuse it only once a slot had
taken the request, with "Failed to initialize samplers").
"""

from __future__ import annotations

from typing import Any

from tray_app.engine.llama_log import capture_llama_log


def grammar_error(vocab: Any, grammar: str, root: str = "root") -> str | None:
    """None when llama.cpp accepts the grammar; otherwise what it said about it."""
    import llama_cpp

    with capture_llama_log() as log:
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), root.encode("utf-8"))
    if sampler:
        llama_cpp.llama_sampler_free(sampler)
        return None
    said = " ".join(line.strip() for line in log.text.splitlines() if line.strip())
    return said or "llama.cpp could not parse it"
