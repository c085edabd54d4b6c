"""The CPU mirror's figures (bench.mirror) as text: each pause beside the 100-token one of its own rounds, and
the GPU worker's throughput with the mirror's work beside it over without."""

from __future__ import annotations

from typing import Any

from tray_app.bench.report import clients_label


def _value(value: Any, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{unit}" if isinstance(value, int | float) else str(value)


def pause_lines(pause: dict[str, Any]) -> list[str]:
    lines = [
        f"failover pause: the GPU worker killed after its {pause['kill_after_tokens']}th streamed token; "
        f"from that token to the next (median of {pause['rounds']} rounds; x: over the 100-token pause "
        "with the mirror in the same state; GPU ran: from the request to the kill, the time the mirror had "
        "to read a first turn)",
        f"  {'prompt':<20} {'mirror':<7} {'tokens':>7} {'GPU ran':>10} {'pause':>10} {'cached':>8}  ratio",
    ]
    for row in pause["cases"]:
        lines.append(
            f"  {row['case']:<20} {'on' if row['mirror'] else 'off':<7} "
            f"{_value(row['prompt_tokens']):>7} {_value(row['gpu_running_ms'], ' ms'):>10} "
            f"{_value(row['pause_ms'], ' ms'):>10} {_value(row['cached_tokens']):>8}  "
            f"x{_value(row['ratio_to_100'], '', 2)}"
            + ("" if row["measured"] else "  (not measured: the fault did not fire)")
        )
    return lines


def throughput_lines(throughput: dict[str, Any]) -> list[str]:
    header = (
        f"GPU worker beside the mirror: clients each sending {throughput['requests_per_client']} chats of "
        f"a {throughput['prompt_tokens']}-token prompt (worth mirroring) and {throughput['max_tokens']} "
        f"tokens, through the router, the mirror off and on (median of {throughput['rounds']} interleaved "
        "rounds)"
    )
    return [header, *(_level_line(level) for level in throughput["levels"])]


def _level_line(level: dict[str, Any]) -> str:
    """One concurrency level: the GPU worker's throughput with the mirror off, then on."""
    return (
        f"  {clients_label(level['clients'])}  "
        f"{_value(level['off_tokens_per_second'], '', 1):>7} -> "
        f"{_value(level['on_tokens_per_second'], '', 1):>7} tokens/s  x{_value(level['ratio'], '', 3)}  "
        f"(the mirror read {_value(level['mirror_read_tokens'])} prompt tokens meanwhile)"
    )


def _row(pause: dict[str, Any], case: str, mirror: bool) -> dict[str, Any]:
    return next((r for r in pause["cases"] if r["case"] == case and r["mirror"] == mirror), {})


def verdict_lines(figures: dict[str, Any]) -> list[str]:
    """The mirror's two targets, each beside its figure: a conversation's follow-up turn pauses at most
    1.5x a 100-token prompt; the GPU worker keeps at least 0.9x its throughput at 4 clients."""
    follow_up = _row(figures["pause"], "follow-up turn", True)
    ratio, tokens = follow_up.get("ratio_to_100"), follow_up.get("prompt_tokens") or 0
    met = ratio is not None and ratio <= 1.5 and tokens >= 1200
    lines = [
        f"  follow-up turn of {_value(tokens)} prompt tokens, mirror on: x{_value(ratio, '', 2)} the "
        f"100-token pause (target: at most x1.5, at least 1,200 tokens): {'met' if met else 'NOT met'}"
    ]
    levels = figures["throughput"]["levels"]
    four: dict[str, Any] = next((level for level in levels if level["clients"] == 4), {})
    share = four.get("ratio")
    where = (
        f"the simulated GPU worker shares the machine's {figures.get('cores')} cores with the CPU worker, "
        "the worst case"
        if figures.get("simulated")
        else "the GPU worker computes on its GPU"
    )
    met = share is not None and share >= 0.9
    lines.append(
        f"  GPU worker at 4 clients, mirror on: x{_value(share, '', 3)} of its throughput off (target: at "
        f"least x0.9; {where}): {'met' if met else 'NOT met'}"
    )
    return lines


def mirror_lines(figures: dict[str, Any] | None) -> list[str]:
    if not figures:
        return []
    return [
        "",
        *pause_lines(figures["pause"]),
        "",
        *throughput_lines(figures["throughput"]),
        "",
        "targets:",
        *verdict_lines(figures),
    ]
