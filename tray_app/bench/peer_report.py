"""The peer bench's figures (bench.peer) as text: per prompt size, the failover pause on each rung, and the
peer's over this machine's CPU's, without and with its CPU mirror."""

from __future__ import annotations

from typing import Any


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"x{value:.2f}"


def _tokens(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _missing(row: dict[str, Any], rounds: int) -> str:
    """Which sides were measured in fewer rounds than asked (the fault fired otherwise, or the job went
    elsewhere)."""
    short = [f"{side} {count}/{rounds}" for side, count in row["measured"].items() if count < rounds]
    return f"  (measured: {', '.join(short)})" if short else ""


def _where(figures: dict[str, Any]) -> str:
    if figures.get("simulated"):
        return (
            "both GPUs simulated: every worker, the peer's GPU included, is a llama-server on this "
            f"machine's {figures.get('cores')} cores"
        )
    return "this machine's GPU and the peer's are real devices"


def peer_lines(figures: dict[str, Any] | None) -> list[str]:
    if not figures:
        return []
    rounds = int(figures["rounds"])
    lines = [
        "failover pause by the next rung: the local GPU worker killed after its "
        f"{figures['kill_after_tokens']}th streamed token; from that token to the next (median of {rounds} "
        "rounds, the sides interleaved)",
        "  peer: the peer's GPU continues; cpu: this machine's CPU, its mirror off; cpu+mirror: its mirror "
        "on",
        f"  {'prompt':<12} {'tokens':>7} {'peer':>10} {'cpu':>10} {'cpu+mirror':>11} {'cached':>7}  "
        f"{'peer/cpu':>8}  {'peer/cpu+mirror':>15}",
    ]
    for row in figures["cases"]:
        prompt = f"about {row['size']:,}"
        lines.append(
            f"  {prompt:<12} {_tokens(row['prompt_tokens']):>7} {_ms(row['peer_ms']):>10} "
            f"{_ms(row['cpu_ms']):>10} {_ms(row['cpu_mirror_ms']):>11} "
            f"{_tokens(row['mirror_cached_tokens']):>7}  "
            f"{_ratio(row['peer_over_cpu']):>8}  {_ratio(row['peer_over_cpu_mirror']):>15}"
            + _missing(row, rounds)
        )
    lines.append(f"  ({_where(figures)}; cached: the CPU's prompt cache at the resume, mirror on)")
    return lines
