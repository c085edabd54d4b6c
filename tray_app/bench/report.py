"""The bench's results as text: every figure next to what it is compared with, and the ratio."""

from __future__ import annotations

from typing import Any

from tray_app.contract.sizes import format_size
from tray_app.device.cost import watcher_cost_lines

ROUTER_ROWS = (
    ("ttft_p50_ms", "streamed time to first token p50"),
    ("stream_total_p50_ms", "streamed whole response p50"),
    ("gap_mean_ms", "streamed inter-chunk gap (mean)"),
    ("p50_ms", "non-streamed latency p50"),
    ("p99_ms", "non-streamed latency p99"),
)
PROFILE_LABELS = {
    "cpu": "CPU worker",
    "gpu_simulated": "simulated GPU worker",
    "gpu_resident": "GPU-resident",
    "planned_split": "planned CPU/GPU split",
    "cpu_fallback": "CPU fallback",
}


def _ms(value: float | None, decimals: int = 1) -> str:
    return "-" if value is None else f"{value:.{decimals}f} ms"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"x{value:.3f}"


def _interval(bounds: list[float] | None) -> str:
    """The added figure's 95 % interval (paired medians only)."""
    return "" if bounds is None else f"  (95 %: {bounds[0]:+.2f} to {bounds[1]:+.2f} ms)"


def _ratio_interval(bounds: list[float] | None) -> str:
    return "" if bounds is None else f" (95 %: x{bounds[0]:.3f} to x{bounds[1]:.3f})"


def _added(value: float | None, bounds: list[float] | None = None) -> str:
    if value is None:
        return ""
    interval = "" if bounds is None else f", 95 %: {bounds[0]:+.2f} to {bounds[1]:+.2f} ms"
    return f"  (added {value:+.2f} ms{interval}: the median of the rounds' differences)"


def clients_label(count: int) -> str:
    """`1 client ` or `4 clients`: the same width either way, so the figures after it line up."""
    return f"{count} client{'' if count == 1 else 's':<2}"


def router_lines(router: dict[str, Any]) -> list[str]:
    lines = [
        f"router overhead: direct to the GPU worker vs through the router ({router['rounds']} rounds, "
        f"{router['max_tokens']} token{'' if router['max_tokens'] == 1 else 's'}, interleaved; "
        "added = median of the paired differences)"
    ]
    intervals = router.get("added_interval_ms", {})
    for key, label in ROUTER_ROWS:
        if key == "gap_mean_ms" and router["max_tokens"] == 1:
            continue  # one token: no gap between chunks
        lines.append(
            f"  {label:<34} {_ms(router['direct'][key], 2):>10} -> {_ms(router['router'][key], 2):>10}  "
            f"{router['added_ms'][key]:+.2f} ms  {_ratio(router['ratio'][key])}"
            + _interval(intervals.get(key))
        )
    lines.append(
        f"  {'non-streamed vs worker streaming':<34} {router['router_own_ms']:+.2f} ms  "
        "(the router streams from the worker; this is the router's own share of the non-streamed figure)"
    )
    cpu = router.get("router_cpu_ms_per_request")
    if cpu is not None:
        lines.append(f"  {'router process CPU per request':<34} {cpu:.2f} ms")
    own = router.get("own_ms")
    if own and own["requests"]:
        lines.append(_own_clock_line(own))
    return lines


def _own_clock_line(own: dict[str, Any]) -> str:
    """What the router measured of itself on the first token, split at the worker."""
    return (
        f"  {'router code on the first token':<34} {own['total_ms']:.2f} ms  (its own clock, p50 of "
        f"{own['requests']} streams: {own['to_worker_ms']:.2f} ms from the request to the worker, "
        f"{own['to_client_ms']:.2f} ms from the worker's first output to the client)"
    )


def floor_lines(proxy: dict[str, Any] | None, router: dict[str, Any]) -> list[str]:
    """The same one-token requests through a byte-for-byte proxy: what the extra hop alone costs here, and
    so the router's own share of its overhead."""
    if proxy is None:
        return []
    lines = ["  through a byte-for-byte proxy instead (the floor of any extra hop on this machine):"]
    for key in ("ttft_p50_ms", "p50_ms"):
        label = dict(ROUTER_ROWS)[key]
        floor, added = proxy["added_ms"][key], router["added_ms"][key]
        lines.append(f"    {label:<32} {floor:+.2f} ms  (the router's own share: {added - floor:+.2f} ms)")
    return lines


def throughput_lines(throughput: dict[str, Any]) -> list[str]:
    lines = [
        f"throughput: concurrent clients, each {throughput['requests_per_client']} requests of "
        f"{throughput['max_tokens']} tokens, direct to the GPU worker's llama-server vs through the router "
        f"(median of {throughput['rounds']} interleaved rounds; x: the median of the rounds' ratios)"
    ]
    for row in throughput["levels"]:
        added = _added(row.get("ttft_added_p50_ms"), row.get("ttft_added_interval_ms"))
        lines.append(_level_line(row, "direct", "router") + added)
    return lines


def against_lines(figures: dict[str, Any]) -> list[str]:
    header = (
        f"throughput: {figures['against']} (model {figures['model']!r}) -> Failsoft at "
        f"{figures['failsoft']}; concurrent clients, each {figures['requests_per_client']} requests of "
        f"{figures['max_tokens']} tokens (median of {figures['rounds']} interleaved rounds; x: the median of "
        "the rounds' ratios, Failsoft over the other)"
    )
    return [header, *(_level_line(row, "other", "failsoft") for row in figures["levels"])]


def _level_line(row: dict[str, Any], before: str, after: str) -> str:
    """One concurrency level of a throughput comparison; `before` and `after` name its two sides' keys
    (`direct` and `router`, or `other` and `failsoft`)."""
    return (
        f"  {clients_label(row['clients'])} "
        f"{row[f'{before}_tokens_per_second']:>8.1f} -> {row[f'{after}_tokens_per_second']:>8.1f} tokens/s  "
        f"{_ratio(row['ratio'])}{_ratio_interval(row.get('ratio_interval'))}   "
        f"TTFT p50 {_ms(row[f'{before}_ttft_p50_ms'], 2)} -> {_ms(row[f'{after}_ttft_p50_ms'], 2)}"
    )


def failover_lines(failover: dict[str, Any]) -> list[str]:
    return [
        f"failover overhead: the GPU worker aborts before its first token, streamed "
        f"({failover['measured']} of {failover['rounds']} rounds measured)",
        f"  failure -> first CPU token (p50)   {_ms(failover['failure_to_first_cpu_token_ms']):>10}",
        f"  CPU worker's own TTFT (p50)        {_ms(failover['cpu_ttft_ms']):>10}",
        f"  failover overhead (difference)     {_ms(failover['overhead_ms']):>10}  "
        f"{_ratio(failover['ratio'])} of the CPU's own TTFT",
    ]


def profile_lines(profiles: dict[str, Any]) -> list[str]:
    figures = profiles["workers"]
    base_key = "cpu" if "cpu" in figures else "cpu_fallback"
    base = figures.get(base_key) or {}
    lines = [
        f"profiles: each worker asked directly, {profiles['max_tokens']} tokens, median of "
        f"{profiles['rounds']} rounds (ratios against the {PROFILE_LABELS[base_key]})"
    ]
    for key, row in figures.items():
        speed, ttft = row.get("tokens_per_second"), row.get("ttft_ms")
        speed_ratio = speed / base["tokens_per_second"] if speed and base.get("tokens_per_second") else None
        lines.append(
            f"  {PROFILE_LABELS.get(key, key):<24} {speed if speed is not None else '-':>8} tokens/s  "
            f"TTFT {_ms(ttft):>10}  speed {_ratio(speed_ratio)}"
        )
    if profiles.get("note"):
        lines.append(f"  note: {profiles['note']}")
    return lines


def planner_lines(planner: dict[str, Any]) -> list[str]:
    lines = ["planner accuracy: estimated / reported by llama.cpp at load (ratio 1.000 is exact)"]
    for role, rows in planner.items():
        parts = []
        for name in ("weights", "kv", "compute"):
            row = rows.get(name) or {}
            reported = row.get("reported_bytes")
            parts.append(
                f"{name} {format_size(row.get('estimated_bytes') or 0)} / "
                f"{format_size(reported) if reported else '?'} {_ratio(row.get('ratio'))}"
            )
        lines.append(
            f"  {role} (n_ctx {rows.get('n_ctx')}, compute {rows.get('compute_source')}): " + "; ".join(parts)
        )
    return lines


def text(results: dict[str, Any]) -> str:
    service = results["service"]
    device = service.get("device") or {}
    label = " [SIMULATED]" if device.get("simulated") else ""
    lines = [
        f"failsoft bench: model {service.get('model')}; GPU {device.get('name')} "
        f"{format_size(int(device.get('total_bytes') or 0))}{label}; {results['seconds']:.0f}s",
        "",
        *router_lines(results["router_fixed_cost"]),
        *floor_lines(results.get("byte_proxy"), results["router_fixed_cost"]),
        "",
        *router_lines(results["router_overhead"]),
        "",
        *throughput_lines(results["throughput"]),
        "",
        *failover_lines(results["failover_overhead"]),
        "",
        *profile_lines(results["profiles"]),
        "",
        *planner_lines(results["planner_accuracy"]),
        *watcher_cost_lines(results.get("device_watcher")),
    ]
    return "\n".join(lines)
