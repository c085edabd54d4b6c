"""Long conversations of a known size for the CPU mirror's drill scenario, its bench and its tests: notes that
differ from their first line for every seed, so that nothing an earlier run cached helps."""

from __future__ import annotations

TOKENS_PER_NOTE = 12  # SmolLM2's tokens for one note of `filler` (measured)
_ADJ = ("amber", "quiet", "salted", "narrow", "early", "copper", "distant", "patient")
_NOUN = ("harbour", "ledger", "lantern", "orchard", "bridge", "archive", "meadow", "signal")
_VERB = ("keeps", "follows", "answers", "crosses", "measures", "carries", "guards", "names")
FOLLOW_UP = {"role": "user", "content": "And then?"}


def filler(tokens: int, seed: int) -> str:
    """About `tokens` tokens of notes."""
    notes = [f"Notebook {seed}."]
    for i in range(max(tokens // TOKENS_PER_NOTE, 1)):
        a, n, v, o = (i * 3 + seed) % 8, (i * 5 + seed) % 8, (i * 7 + seed) % 8, (i + seed * 3) % 8
        notes.append(f"Note {i}: the {_ADJ[a]} {_NOUN[n]} {_VERB[v]} the {_NOUN[o]}.")
    return " ".join(notes)


def conversation(tokens: int, seed: int) -> list[dict[str, str]]:
    """A first turn of about `tokens` prompt tokens: a system prompt of notes and a question about them."""
    system = "You answer questions about the notes below in plain sentences.\n" + filler(tokens - 40, seed)
    return [{"role": "system", "content": system}, {"role": "user", "content": "Describe the first notes."}]


def next_turn(messages: list[dict[str, str]], answer: str) -> list[dict[str, str]]:
    """The conversation after `answer`, with the user's next question."""
    return [*messages, {"role": "assistant", "content": answer}, FOLLOW_UP]
