"""What a job's replay on another worker sends: the job's own request, or (a stream resumed after text the
client already has) a completion of the prompt plus that text, or a thinking model's continued chat.

The executor sends these, and the CPU mirror (jobs.mirror) reads exactly their prompts ahead of time, so a
replay finds them in llama-server's prompt cache: one function for both keeps the two byte for byte alike.
"""

from __future__ import annotations

from typing import Any

from tray_app.jobs.continuation import continuation_messages
from tray_app.jobs.registry import Job, worker_fields
from tray_app.jobs.worker_port import Prompts

CHAT_PATH = "/v1/chat/completions"
COMPLETION_PATH = "/v1/completions"

# Sampling fields carried over when a chat is resumed as a completion-style prompt.
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
)


def first_path(job: Job) -> str:
    return CHAT_PATH if job.kind == "chat" else COMPLETION_PATH


async def completion_prompt(job: Job, prompts: Prompts) -> str | None:
    """The prompt a resumed job's completion starts from: a chat's messages through the workers' template,
    or a completion's own prompt; None for a prompt of token ids."""
    if job.kind == "chat":
        return (await prompts.chat_prompt(job.body["messages"]))[0]
    return completion_text(job)


def completion_text(job: Job) -> str | None:
    """A completion's own prompt as text; None for a prompt of token ids."""
    prompt = job.body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt and isinstance(prompt[0], str) else None
    return prompt if isinstance(prompt, str) else None


async def resume_request(
    job: Job, prompts: Prompts, reasoning: str, text: str, remaining: int, continued_chat: bool
) -> tuple[str, dict[str, Any]]:
    """The path and body (without the stream fields) that resume `job` after `reasoning` and `text` reached
    its client, with `remaining` tokens left to generate. `continued_chat`: a thinking model's answer, which
    llama-server continues as a chat (jobs.continuation)."""
    body: dict[str, Any]
    if continued_chat:
        return continued_chat_request(job, reasoning, text, remaining)
    if job.kind == "chat":
        prompt, stops = await prompts.chat_prompt(job.body["messages"])
        user_stop = job.body.get("stop")
        stops = stops + ([user_stop] if isinstance(user_stop, str) else list(user_stop or []))
        body = {name: job.body[name] for name in SAMPLING_FIELDS if name in job.body}
        body.update(prompt=prompt + text, max_tokens=remaining, stop=stops)
        return COMPLETION_PATH, body
    # The allow-list, as the first attempt had it: no field the worker was not sent then, and no
    # `max_completion_tokens`, which llama-server would read before `max_tokens` = remaining.
    body = worker_fields(job.kind, job.body)
    prompt = job.body["prompt"] if isinstance(job.body["prompt"], str) else job.body["prompt"][0]
    body.update(prompt=prompt + text, max_tokens=remaining)
    return COMPLETION_PATH, body


def continued_chat_request(job: Job, reasoning: str, text: str, remaining: int) -> tuple[str, dict[str, Any]]:
    """A thinking model's answer continued as a chat (jobs.continuation), which llama-server renders."""
    body = worker_fields(job.kind, job.body)
    body.update(messages=continuation_messages(job.body["messages"], reasoning, text), max_tokens=remaining)
    return CHAT_PATH, body
