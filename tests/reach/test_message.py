"""What a channel sends: one message per event or per burst, the approval's actions, the channels' shapes."""

from __future__ import annotations

from typing import Any

import pytest

from tray_app.contract.events import (
    ApprovalNeeded,
    FallbackStarted,
    GpuPathChanged,
    JobStateChanged,
    WorkerUnhealthy,
)
from tray_app.reach import apprise_channel, ntfy, webhook
from tray_app.reach.channels import ChannelError
from tray_app.reach.events import name_of
from tray_app.reach.message import SET_PUBLIC_URL, compose

PAGE = "https://box.example/ui/"


def links(job: str) -> dict[str, str]:
    return {
        "approve": f"https://box.example/ui/act/{job}-yes",
        "reject": f"https://box.example/ui/act/{job}-no",
    }


PROMPT = "Tell me about the sea"


def approval(job: str = "job-1", seconds: float = 80) -> dict[str, Any]:
    """As the channel gets it: the event's wire form."""
    return ApprovalNeeded(
        job_id=job,
        estimated_seconds=seconds,
        model="smollm2",
        prompt_tokens=1234,
        reason="gpu_unavailable",
        prompt_preview=PROMPT,
    ).to_dict()


def test_an_approval_carries_approve_and_reject_for_its_job() -> None:
    message = compose([approval()], links, PAGE)
    assert message is not None
    assert message.title == "Approval needed"
    assert "job-1 needs about 1 min 20 s on the CPU" in message.body
    assert [(a.label, a.url, a.method) for a in message.actions] == [
        ("Approve", "https://box.example/ui/act/job-1-yes", "POST"),
        ("Reject", "https://box.example/ui/act/job-1-no", "POST"),
        ("Open", PAGE, "GET"),
    ]


def test_an_approval_says_the_model_the_size_and_the_reason_and_never_the_prompt() -> None:
    message = compose([approval()], links, PAGE)
    assert message is not None
    assert "Model smollm2 · prompt 1,234 tokens · the GPU worker is not available (gpu_unavailable)" in (
        message.body
    )
    assert "sea" not in message.body
    assert all("sea" not in str(event) for event in message.events)


def test_a_channel_that_asked_for_previews_gets_the_prompts_opening() -> None:
    long = "Summarise   this\nreport: " + "x" * 300
    message = compose([approval()], links, PAGE, previews={"job-1": long, "job-2": "another job's prompt"})
    assert message is not None
    assert "\n“Summarise this report: xxx" in message.body  # on one line
    quoted = message.body.split("“", 1)[1].rstrip("”")
    assert len(quoted) == 120
    assert "another job" not in message.body


def test_a_burst_quotes_no_prompt() -> None:
    message = compose([approval("job-1"), approval("job-2")], links, PAGE, previews={"job-1": PROMPT})
    assert message is not None and "2 jobs wait for approval" in message.body
    assert PROMPT not in message.body


def test_without_a_public_url_the_actions_are_left_out_and_the_message_says_how() -> None:
    message = compose([approval()], lambda job: None, None)
    assert message is not None and message.actions == ()
    assert SET_PUBLIC_URL in message.body


def test_a_burst_is_one_message_led_by_the_worst() -> None:
    events = [
        FallbackStarted(job_id="job-1", reason="crash_abort").to_dict(),
        approval("job-2"),
        approval("job-3"),
        WorkerUnhealthy(role="gpu", kind="crash_abort", reason="exit").to_dict(),
        JobStateChanged(job_id="job-1", state="running").to_dict(),  # not a message
    ]
    message = compose(events, links, PAGE)
    assert message is not None
    assert message.level == "critical" and message.title.startswith("GPU worker failed (+3 more)")
    assert "2 jobs wait for approval" in message.body and "1 job moved to the CPU" in message.body
    # Two jobs cannot share two buttons: the status page decides them.
    assert [(a.label, a.method) for a in message.actions] == [("Open", "GET")]


def test_a_move_to_a_peer_names_the_peer_and_never_the_cpu() -> None:
    event = FallbackStarted(job_id="job-1", reason="oom_decode", to="peer:gaming-pc").to_dict()
    message = compose([event], links, PAGE)
    assert message is not None and message.level == "warning"
    assert message.title == "Moved to gaming-pc"
    assert message.body == (
        "job-1 continues on gaming-pc, another machine's GPU: the GPU ran out of memory while generating "
        "(oom_decode)."
    )
    assert "CPU" not in message.title + message.body


def test_a_move_to_the_cpu_reads_as_before() -> None:
    message = compose([FallbackStarted(job_id="job-1", reason="crash_abort").to_dict()], links, PAGE)
    assert message is not None
    assert (message.title, message.body) == (
        "Moved to the CPU",
        "job-1 continues on the CPU: the GPU worker crashed (crash_abort).",
    )


def test_a_burst_counts_moves_to_the_cpu_and_to_peers_apart() -> None:
    events = [
        FallbackStarted(job_id="job-1", reason="oom_decode", to="peer:gaming-pc").to_dict(),
        FallbackStarted(job_id="job-2", reason="oom_decode", to="peer:nas").to_dict(),
        FallbackStarted(job_id="job-3", reason="peer_failed").to_dict(),
    ]
    message = compose(events, links, PAGE)
    assert message is not None
    assert message.body.splitlines() == ["1 job moved to the CPU", "2 jobs moved to another machine"]
    only_peer = compose([events[0], approval("job-4")], links, PAGE)
    assert only_peer is not None
    assert only_peer.body.splitlines() == [
        "1 job waits for approval: decide on the status page",
        "1 job moved to another machine",
    ]


def test_nothing_worth_a_message_gives_none() -> None:
    assert compose([JobStateChanged(job_id="j", state="queued").to_dict()], links, PAGE) is None


@pytest.mark.parametrize(
    ("state", "previous", "name"),
    [
        ("lost", "normal", "gpu_lost"),
        ("normal", "lost", "gpu_lost"),
        ("squeezed", "normal", "gpu_taken"),
        ("yielded", "normal", "gpu_taken"),
        ("normal", "squeezed", "gpu_taken"),
        ("normal", "normal", None),
    ],
)
def test_gpu_path_changes_fall_under_their_names(state: str, previous: str, name: str | None) -> None:
    event = GpuPathChanged(state=state, previous=previous, reason="r", action="a").to_dict()
    assert name_of(event) == name


def test_ntfy_gets_http_buttons_on_its_topic() -> None:
    message = compose([approval()], links, PAGE)
    assert message is not None
    server, topic = ntfy.split_topic("https://ntfy.example/sub/path/failsoft-alerts")
    assert (server, topic) == ("https://ntfy.example/sub/path/", "failsoft-alerts")
    body = ntfy.payload(message, topic)
    assert body["topic"] == "failsoft-alerts" and body["priority"] == 4 and body["click"] == PAGE
    assert body["actions"][0] == {
        "action": "http",
        "label": "Approve",
        "url": "https://box.example/ui/act/job-1-yes",
        "method": "POST",
        "clear": True,
    }
    assert body["actions"][2]["action"] == "view"
    with pytest.raises(ChannelError):
        ntfy.split_topic("https://ntfy.example")
    # The error reaches the status and the log: a password in the URL must not.
    with pytest.raises(ChannelError) as refused:
        ntfy.split_topic("https://me:s3cret@ntfy.example")
    assert "s3cret" not in str(refused.value) and "…@ntfy.example" in str(refused.value)


def test_a_webhook_gets_the_message_its_links_and_its_events() -> None:
    message = compose([approval()], links, PAGE)
    assert message is not None
    body = webhook.payload(message)
    assert body["source"] == "failsoft" and body["events"][0]["job_id"] == "job-1"
    assert body["actions"][0] == {"label": "Approve", "url": links("job-1")["approve"], "method": "POST"}


def test_apprise_gets_the_links_in_its_text() -> None:
    message = compose([approval()], links, PAGE)
    assert message is not None
    assert f"Approve (press): {links('job-1')['approve']}" in apprise_channel.text(message)
