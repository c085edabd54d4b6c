"""Ask llama.cpp's own parser whether a GBNF grammar is valid, without generating anything.

A grammar llama.cpp cannot parse makes `llama_sampler_init_grammar` return NULL, and llama-cpp-python adds
that NULL to its sampler chain: the worker dies of a segmentation fault on the next token. One such request
would take down the GPU worker and then, on failover, the CPU worker. The router checks a request's grammar
at the door with this; the workers check again where the sampler is built (`worker/grammar_guard.py`).
"""

from __future__ import annotations

from typing import Any

from tray_app.budget.llama_log import capture_llama_log

# How a worker words a refused grammar; the router reads it as the request's fault (no failover).
INVALID_GRAMMAR = "the grammar is not valid GBNF"


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
