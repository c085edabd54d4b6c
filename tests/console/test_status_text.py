"""What `failsoft status` and `failsoft approvals` print, from answers in the documented shape."""

from __future__ import annotations

from tests.support.status_samples import GAMING_PC, NAS, MiB, make_library_status, make_status, with_peers
from tests.view.test_remote_bars import ATTIC_BOX, DOWN, NAS_BOX, NAS_SHARE, with_rpc
from tray_app.config.notify import NotifyConfig
from tray_app.console.status_text import render_pending, render_status
from tray_app.contract.sizes import format_size
from tray_app.contract.status import ServiceStatus
from tray_app.reach.dispatcher import ChannelState
from tray_app.view.pending import PendingJob

URL = "http://127.0.0.1:8750"
NOW = 1_800_000_000.0


def test_a_simulated_gpu_is_named_so_and_its_budget_is_split_in_parts() -> None:
    status = make_status(pending=1)
    text = render_status(status, URL, NOW)
    assert "GPU: simulated GPU, 4.00 GiB [SIMULATED]" in text
    assert "GPU serving · simulated 4.00 GiB · context 4,096 × 2 parallel · 1 awaiting approval" in text
    plan = status["plan"]
    for label, key in (("Weights", "weights_bytes"), ("KV cache", "kv_bytes"), ("Free", "free_bytes")):
        row = next(line for line in text.splitlines() if line.strip().startswith(label))
        assert row.endswith(format_size(plan[key])), row
    assert "Context 4,096 per request · 2 parallel · 31/31 layers on GPU" in text
    assert "CPU worker: ready · 1/4 slots busy · pid 4243" in text
    assert "1 awaiting approval (`failsoft approvals`)" in text


def test_a_real_gpu_is_never_called_simulated() -> None:
    status = make_status(simulated=False)
    status["device"]["name"] = "NVIDIA GeForce RTX 4090"
    text = render_status(status, URL, NOW)
    assert "GPU: NVIDIA GeForce RTX 4090, 4.00 GiB -" in text
    assert "SIMULATED" not in text and "simulated" not in text.replace("simulated GPU", "")


def test_another_model_on_the_gpu_gets_its_share_out_of_the_free_part() -> None:
    status = make_library_status()
    text = render_status(status, URL, NOW)
    free = status["plan"]["free_bytes"] - 300 * MiB
    assert any(
        line.strip().startswith("gemma3-270m") and line.endswith("300.00 MiB") for line in text.splitlines()
    )
    assert any(
        line.strip().startswith("Free") and line.endswith(format_size(free)) for line in text.splitlines()
    )
    assert "gemma3-270m · on the GPU · 300.00 MiB VRAM · unloads in 42 s" in text
    assert "phi-4-mini · not loaded" in text


def test_a_failed_worker_says_why_and_when_it_is_tried_again() -> None:
    status = make_status(gpu="failed")
    status["workers"]["gpu"].update(
        reason="the load ran out of GPU memory",
        last_failure={"kind": "oom_load", "message": "cudaMalloc failed: out of memory"},
        next_retry_at=NOW + 30,
        slots=4,
    )
    text = render_status(status, URL, NOW)
    assert "GPU worker: failed · pid 4242" in text  # no slots to count on a failed worker
    assert "the load ran out of GPU memory" in text
    assert "last failure: oom_load: cudaMalloc failed: out of memory" in text
    assert "next try in 30 s" in text


def test_peers_are_a_block_of_their_own_after_the_workers() -> None:
    unreachable = {"kind": "unreachable", "message": "no answer to GET /health within 3 s", "at": 0}
    nas = {**NAS, "models": ["qwen3-8b"], "last_failure": unreachable}
    status = with_peers({**GAMING_PC, "models": [], "next_probe_in": 30.0}, nas)
    text = render_status(status, URL, NOW)
    block = text.split("\n\nPeers:\n", 1)[1].split("\n\n", 1)[0]
    assert block.splitlines() == [
        "  gaming-pc  ready (GPU)  http://192.168.1.20:8750",
        "      priority 0 · 2 slots · serves the main model",
        "  nas  down: unreachable (next try in 12 s)  http://192.168.1.30:8080",
        "      priority 1 · 1 slot · serves qwen3-8b",
        "      last failure: unreachable: no answer to GET /health within 3 s",
    ]
    assert text.index("Workers:") < text.index("Peers:") < text.index("Models:")


def test_without_peers_there_is_no_peers_block() -> None:
    assert "Peers" not in render_status(make_status(), URL, NOW)


def test_without_a_gpu_there_is_no_budget_bar_but_the_reason() -> None:
    status = make_status()
    status["plan"] = {"total_bytes": 0, "reason": "no NVIDIA driver found (NVML: not loaded)"}
    text = render_status(status, URL, NOW)
    assert "No GPU budget: no NVIDIA driver found (NVML: not loaded)" in text
    assert "VRAM budget" not in text


def test_rpc_boxes_follow_the_budget_a_share_each_and_a_line_per_box_not_used() -> None:
    text = render_status(with_rpc([NAS_BOX, ATTIC_BOX], [NAS_SHARE]), URL, NOW)
    budget = text.split("VRAM budget", 1)[1].split("\n\n", 1)[0].splitlines()
    at = next(i for i, line in enumerate(budget) if "RPC0" in line)
    assert budget[at - 1].strip().startswith("Context 4,096 per request")  # after the GPU's own caps
    assert budget[at:] == [
        "  RPC0 · nas (192.168.1.30:50052): 5 of 31 layers (blocks 26-29 and the output layer)",
        "                   ######.......................... 1.00 GiB of 5.50 GiB usable "
        "(Weights 900.00 MiB, KV cache 100.00 MiB, Compute 24.00 MiB)",
        f"  attic (192.168.1.40:50052): not used - {DOWN}",
    ]


def test_without_a_gpu_budget_a_box_still_says_why_it_is_not_used() -> None:
    status = with_rpc([ATTIC_BOX], [])
    status["plan"] = {"total_bytes": 0, "reason": "no NVIDIA driver found (NVML: not loaded)"}
    lines = render_status(status, URL, NOW).splitlines()
    at = lines.index("No GPU budget: no NVIDIA driver found (NVML: not loaded)")
    assert lines[at + 1] == f"  attic (192.168.1.40:50052): not used - {DOWN}"


def test_without_rpc_boxes_the_budget_ends_with_the_caps() -> None:
    budget = render_status(make_status(), URL, NOW).split("VRAM budget", 1)[1].split("\n\n", 1)[0]
    assert budget.splitlines()[-1].startswith("  Context 4,096 per request")
    assert "RPC" not in budget and "not used" not in budget


def test_waiting_jobs_are_listed_oldest_first_with_the_question_each_asks() -> None:
    jobs = [
        PendingJob(
            "job-b", 120.0, "Summarise this\nlong text " + "x" * 100, NOW - 30, "qwen3-8b", "gemma3-270m"
        ),
        PendingJob("job-a", 0.0, "hi", NOW - 90, "qwen3-8b"),
    ]
    text = render_pending(sorted(jobs, key=lambda job: job.created_at), NOW)
    lines = text.splitlines()
    assert lines[0].startswith("2 jobs wait for approval")
    assert lines[1] == "  job-a  waiting 1 min 30 s  qwen3-8b on the CPU in about an unknown time"
    assert (
        lines[3]
        == "  job-b  waiting 30 s  gemma3-270m on the GPU now, or qwen3-8b on the CPU in about 2 min 00 s?"
    )
    assert lines[4].strip().startswith("'Summarise this long text") and lines[4].endswith("…'")
    assert render_pending([], NOW) == "No job waits for approval."


def test_the_cpu_mirror_says_what_it_covers_and_how_far_behind_it_is() -> None:
    status = make_status()
    status["cpu_plan"]["prompt_cache_bytes"] = 512 * MiB
    status["mirror"].update(following=3, covered=2, tokens_behind=640, reading=1)
    text = render_status(status, URL, NOW)
    assert "CPU mirror: 2 of 3 running jobs covered, 640 tokens behind, reading now (1)" in text
    assert "prompt cache up to 512.00 MiB" in text
    status["mirror"]["enabled"] = False
    assert "CPU mirror: off (cpu.mirror = false)" in render_status(status, URL, NOW)


def _channel(name: str, kind: str, **fields: object) -> dict[str, object]:
    """A channel as /failsoft/status has it (tray_app.reach.dispatcher.ChannelState.status)."""
    channel: dict[str, object] = {
        "name": name,
        "kind": kind,
        "where": "https://ntfy.example:8080",
        "events": ["approval"],
        "quiet_hours": "",
        "sent": 0,
        "failed": 0,
        "dropped": 0,
        "pending": 0,
        "last_sent_at": None,
        "last_error": "",
        "last_error_at": None,
    }
    return {**channel, **fields}


def _notify_block(status: ServiceStatus) -> list[str]:
    return render_status(status, URL, NOW).split("\n\n")[-1].splitlines()


def test_each_notify_channel_is_one_line_with_its_host_events_and_state() -> None:
    status = make_status()
    status["notify"] = [
        _channel("phone", "ntfy", quiet_hours="22:00-07:00", pending=2, sent=3, last_sent_at=NOW - 65),
        _channel(
            "down",
            "webhook",
            where="http://127.0.0.1:9",
            events=["approval", "fallback", "worker_failed", "gpu_taken", "gpu_lost"],
            sent=1,
            failed=2,
            last_sent_at=NOW - 600,
            last_error="http://127.0.0.1:9 answered 500:\n  Internal Server Error",
            last_error_at=NOW - 5,
        ),
        # An error before the latest delivery is over: the channel works again.
        _channel(
            "webhook-3",
            "webhook",
            where="http://ha.lan",
            events=[],
            sent=4,
            failed=1,
            last_sent_at=NOW - 10,
            last_error="ReadTimeout posting to http://ha.lan",
            last_error_at=NOW - 20,
        ),
        _channel("apprise-4", "apprise", where="gotify://…"),
    ]
    assert _notify_block(status) == [
        "Notify:",
        "  phone (ntfy) → https://ntfy.example:8080 · approval · quiet 22:00-07:00 · 2 held · ok, 3 sent,"
        " the last 1 min 05 s ago",
        "  down (webhook) → http://127.0.0.1:9 · all events · FAILING, last error 5 s ago:"
        " http://127.0.0.1:9 answered 500: Internal Server Error (1 sent, 2 failed)",
        "  webhook-3 → http://ha.lan · no events · ok, 4 sent, the last 10 s ago (1 failed before)",
        "  apprise-4 → gotify://… · approval · ok, nothing sent yet",
    ]


def test_without_channels_status_says_so_and_where_to_set_one_up() -> None:
    status = make_status()
    status["notify"] = []
    assert _notify_block(status) == [
        'Notify: no channels (phone push and webhooks: [[notify]], see "Away from the server" in the README)'
    ]
    del status["notify"]  # a service from before the channels
    assert _notify_block(status) == ["Notify: not reported"]


def test_a_channel_shows_its_host_and_never_its_topic_or_token() -> None:
    """The line from the dispatcher's own status of a channel whose URL and token hold secrets."""
    cfg = NotifyConfig(
        kind="ntfy",
        url="https://me:pa55@ntfy.example:8080/secret-topic?auth=x",
        token="tk_secret",
        name="phone",
    )
    state = ChannelState(cfg, None)
    state.failed, state.last_error, state.last_error_at = 1, "an ntfy url ends with its topic", NOW - 3
    status = make_status()
    status["notify"] = [state.status()]
    [header, line] = _notify_block(status)
    assert header == "Notify:"
    assert line.startswith(
        "  phone (ntfy) → https://ntfy.example:8080 · all events · FAILING, last error 3 s"
    )
    for secret in ("secret-topic", "tk_secret", "pa55", "auth"):
        assert secret not in line
