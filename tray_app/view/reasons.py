"""Reason codes in words, one table for the tray's messages, the chat's badges and their tooltips: a code
the service sends (a `Reason`, a failure kind, a refused load's error code) is worded once, here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tray_app.contract.roles import PEER_ROLE_PREFIX
from tray_app.contract.vocabulary import Reason


@dataclass(frozen=True)
class Words:
    long: str  # a clause for a message or a tooltip: "… continues on the CPU: <long> (<code>)."
    short: str = ""  # a few words for a badge; "" where a badge shows the code itself


REASON_WORDS: dict[str, Words] = {
    # How a GPU worker failed (the failure kinds): the reason a job moved to the CPU.
    "oom_decode": Words("the GPU ran out of memory while generating", "GPU out of memory"),
    "oom_load": Words("the GPU ran out of memory loading the model", "GPU out of memory at load"),
    "crash_abort": Words("the GPU worker crashed", "GPU worker crashed"),
    "killed": Words("the GPU worker was killed", "GPU worker killed"),
    "hung": Words("the GPU worker stopped answering", "GPU worker hung"),
    "exited": Words("the GPU worker exited", "GPU worker exited"),
    "bad_config": Words("the GPU worker could not start with its configuration"),
    Reason.EXCEEDS_GPU_PROFILE: Words(
        "the request is larger than the GPU profile", "too large for the GPU profile"
    ),
    Reason.GPU_UNAVAILABLE: Words("the GPU worker is not available", "GPU worker unavailable"),
    Reason.APPROVAL_REQUIRED: Words("the CPU run waits for approval"),
    Reason.FALLBACK_DISABLED: Words("fallback is turned off in the settings"),
    Reason.CONTEXT_EXCEEDED: Words("the request does not fit any worker's context"),
    Reason.CPU_TOO_SLOW: Words("the CPU would miss the deadline"),
    Reason.STAND_IN: Words("a smaller model answered on the GPU"),
    Reason.CPU_RAM_INSUFFICIENT: Words("there is not enough RAM for the CPU worker"),
    Reason.NO_CPU_WORKER: Words("no CPU worker is available"),
    Reason.EFFECTS_DELIVERED: Words("a tool call was already delivered"),
    Reason.STREAM_STARTED: Words("part of the answer was already sent"),
    Reason.CONSTRAINED_STREAM_STARTED: Words(
        "part of an answer bound to a grammar, schema or tools was already sent"
    ),
    Reason.APPROVAL_BACKLOG_FULL: Words("too many jobs already wait for approval"),
    Reason.QUEUE_FULL: Words("too many requests already wait for a worker", "queue full"),
    Reason.QUEUE_TIMEOUT: Words("no worker came free in time", "no free worker in time"),
    Reason.TOO_MANY_JOBS: Words("too many background jobs are already unfinished"),
    Reason.JOURNAL_FAILED: Words("the job journal could not store it"),
    Reason.INTERNAL_ERROR: Words("the router failed on it (see the service log)", "router error"),
    Reason.CLIENT_DISCONNECTED: Words("the client went away or stopped reading", "client left"),
    Reason.CANCELLED_BY_REQUEST: Words("it was cancelled by request", "cancelled"),
    Reason.REJECTED: Words("the CPU run was rejected", "rejected"),
    Reason.SERVICE_RESTARTED: Words("the service restarted; the client's connection was lost"),
    Reason.CPU_ATTEMPT_FAILED: Words("the CPU worker failed it too", "CPU failed too"),
    Reason.NO_WORKER_FOR_MODEL: Words("the model has no worker here"),
    Reason.PEER_FAILED: Words("another machine's server failed or refused it", "other machine failed"),
    # Why loading or unloading a library model was refused (the error codes of /failsoft/models/...).
    Reason.MODEL_DOES_NOT_FIT: Words("the model does not fit in the memory free now"),
    "model_not_found": Words("the service has no model by that name"),
    "model_busy": Words("requests are running on the model"),
    "model_not_on_device": Words("the model has no worker on that device"),
    "model_not_ready": Words("the model did not become ready in time"),
    "main_model": Words("the main model is always kept loaded"),
    # The GPU path's states (`gpu_path` events and status): what another program did to the GPU.
    "squeezed": Words("another program took GPU memory the plan counted on", "GPU squeezed"),
    "yielded": Words("the GPU is given to another program", "GPU yielded"),
    "lost": Words("the GPU failed or is gone", "GPU lost"),
    "normal": Words("the GPU serves as planned again", "GPU back"),
}

# A notification's title when the GPU path changes, by its new state.
GPU_PATH_TITLES = {
    "squeezed": "Another program took GPU memory",
    "yielded": "GPU given to another program",
    "lost": "GPU lost",
    "normal": "GPU back",
}


def reason_text(reason: str) -> str:
    """A reason code in words, keeping the code itself for anyone searching the logs."""
    words = REASON_WORDS.get(reason)
    return f"{words.long} ({reason})" if words else reason or "no reason given"


def short_reason(reason: str) -> str:
    """A reason code in a badge's few words, else the code itself."""
    words = REASON_WORDS.get(reason)
    return words.short if words and words.short else reason


# A peer ([[peers]]: another machine's server) in a sentence: what it is, beside its name.
PEER_GPU = "another machine's GPU"
UNNAMED_PEER = "another machine"  # a peer's place that names none (the route "peer" alone)


def peer_name(place: str) -> str | None:
    """The peer in a place or a worker role: "peer:gaming-pc" is "gaming-pc", the bare route "peer" is
    UNNAMED_PEER; None for this machine's own workers ("cpu", "gpu", "cpu@gemma3-270m")."""
    if place in ("peer", PEER_ROLE_PREFIX):
        return UNNAMED_PEER
    if place.startswith(PEER_ROLE_PREFIX):
        return place.removeprefix(PEER_ROLE_PREFIX)
    return None


def fallback_to(event: Mapping[str, Any]) -> str:
    """Where a `fallback_started` event's job continues; an older service's event names no place: the CPU."""
    return str(event.get("to") or "cpu")


def moves_to_peer(event: Mapping[str, Any]) -> bool:
    """A `fallback_started` event whose job continues on a peer, not on this machine's CPU."""
    return event.get("type") == "fallback_started" and peer_name(fallback_to(event)) is not None


def fallback_target(to: str) -> str:
    """Where a job moved, in a title's few words: "the CPU", or the peer's name."""
    return peer_name(to) or "the CPU"


def peer_place(name: str, aside: bool = False) -> str:
    """A peer by its name in a sentence: "gaming-pc, another machine's GPU" ("gaming-pc (another machine's
    GPU)" with `aside`, for a line whose clause goes on)."""
    if name == UNNAMED_PEER:
        return PEER_GPU
    return f"{name} ({PEER_GPU})" if aside else f"{name}, {PEER_GPU}"


def fallback_place(to: str, aside: bool = False) -> str:
    """Where a job moved (a `fallback_started` event's `to`), in a sentence: "the CPU", or the peer with
    what it is (peer_place). Never "the CPU" for a peer: its answer comes from another machine."""
    name = peer_name(to)
    return "the CPU" if name is None else peer_place(name, aside)
