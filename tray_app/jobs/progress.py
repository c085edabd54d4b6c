"""What one job produced so far, across its attempts, and what that allows a resumed attempt to keep."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tray_app.jobs.assemble import Assembler
from tray_app.jobs.registry import Job
from tray_app.jobs.worker_port import Prompts
from tray_app.tokenizer.wire import TokenizerFailed


@dataclass
class Progress:
    """What one job produced so far, across attempts."""

    assembler: Assembler
    delivered_text: str = ""  # streamed: text that reached the client
    delivered_reasoning: str = ""  # streamed: a thinking model's reasoning that reached the client
    delivered_tokens: int = 0
    tool_call_delivered: bool = False
    role_sent: bool = False
    worker_pid: int | None = None  # the process the current attempt talks to
    gpu_retries: int = 0  # attempts sent to the GPU again because it was only busy or starting
    chunk_id: str = ""
    created: int = 0
    model: str = ""

    @property
    def output_delivered(self) -> bool:
        """The client has generated text: the answer's, or its reasoning's."""
        return bool(self.delivered_text or self.delivered_reasoning)

    def reset_undelivered(self, kind: str) -> None:
        """A non-streamed replay starts from nothing: the failed attempt's output never left the router."""
        self.assembler = Assembler(kind)


async def delivered_tokens(progress: Progress, tokens: Prompts) -> int:
    """The tokens of what the client already has: its reasoning's and text's own count, or the chunks they
    came in where those are more. A chunk may carry more than one token, so counting chunks alone would leave
    a resumed answer a budget beyond the request's `max_tokens`."""
    counted = 0
    for text in (progress.delivered_reasoning, progress.delivered_text):
        if not text:
            continue
        try:
            counted += await tokens.count_text(text, special=False, add_bos=False)
        except TokenizerFailed:
            return progress.delivered_tokens  # the chunks' count: at worst a budget a little too long
    return max(progress.delivered_tokens, counted)


def constrained_output(body: dict[str, Any]) -> bool:
    """Whether the answer has a shape a continuation on the CPU (a plain completion of the text so far)
    could not keep: a grammar, a JSON schema or format, tools, or log probabilities for every token."""
    response_format = body.get("response_format")
    shaped = isinstance(response_format, dict) and response_format.get("type", "text") != "text"
    asked = body.get("grammar") or body.get("json_schema") or body.get("tools") or body.get("logprobs")
    return bool(asked or shaped)


def continues_chat(job: Job, progress: Progress) -> bool:
    """Whether a resumed stream of this job is a chat continuation (jobs.continuation): a thinking model's,
    whose reasoning reached the client. Not after an assistant prefill of the request's own: llama-server
    continues one trailing assistant message, not two."""
    messages = job.body.get("messages") or [{}]
    prefilled = messages[-1].get("role") == "assistant"
    return job.kind == "chat" and bool(progress.delivered_reasoning) and not prefilled


def shape_survives_resume(job: Job, progress: Progress) -> bool:
    """A chat continuation that has sent only reasoning keeps the request's tools and response format: they
    shape the answer still to come, none of which reached the client. A raw grammar (from the first token)
    or log probabilities it cannot promise."""
    only_reasoning = not progress.delivered_text and not progress.tool_call_delivered
    unkept = job.body.get("grammar") or job.body.get("logprobs")
    return continues_chat(job, progress) and only_reasoning and not unkept
