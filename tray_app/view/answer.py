"""What the chat says under an answer: a badge for who served it (GPU, CPU, a peer, failed over, with the
reason) and how fast, one for the model and device that answered, and a finished job's text read back. No Qt
here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from tray_app.contract.status import JobSummary
from tray_app.contract.vocabulary import Reason
from tray_app.view.reasons import UNNAMED_PEER, peer_name, peer_place, reason_text, short_reason
from tray_app.view.state import device_name, where_text

MODEL_NAME_CHARS = 36  # a badge shows at most this much of a model's name; its tooltip has all of it
# A peer's answer is neither this machine's GPU's nor its CPU's: its badges take a failover's colours (the
# chat colours only the kinds in ui/answer_view.py's BADGE_COLORS).
PEER_BADGE_KIND = "failover"


class AnswerInfo(TypedDict, total=False):
    """What the badges read of an answer's `failsoft` object, or of its job read back: any field may be
    missing or None (a service that names no model, a job that never ran)."""

    worker: str | None  # the worker's role: "gpu", "cpu", "cpu@gemma3-270m", "peer:gaming-pc"
    device: str | None  # this machine's "gpu" or "cpu"; None on a peer
    route: str | None  # "gpu", "peer" or "cpu"
    peer: str | None  # the peer's name, when route is "peer"
    model: str | None
    stand_in_for: str | None
    attempts: int | None
    fallback_reason: str | None


@dataclass(frozen=True)
class Badge:
    kind: str  # gpu, cpu, failover (also a peer's answer: PEER_BADGE_KIND), failed, stopped, stand_in
    text: str
    detail: str = ""  # the long form, shown as the badge's tooltip


def tokens_per_second(tokens: int, seconds: float) -> float | None:
    if tokens < 2 or seconds <= 0:
        return None
    return tokens / seconds


def answered_on(info: AnswerInfo) -> str:
    """The device that answered: the service's `device`, else the worker's role ("cpu@gemma3-270m": cpu)."""
    return str(info.get("device") or str(info.get("worker") or "").partition("@")[0])


def answering_peer(info: AnswerInfo) -> str | None:
    """The peer (another machine's server) that answered: the answer's `peer`, else its worker's role
    ("peer:gaming-pc", a job read back); None when this machine answered."""
    if info.get("route") == "peer" or info.get("peer"):
        return str(info.get("peer") or "") or peer_name(str(info.get("worker") or "")) or UNNAMED_PEER
    return peer_name(str(info.get("worker") or ""))


def answer_badge(info: AnswerInfo, tokens: int, seconds: float, simulated: bool = False) -> Badge:
    """Who served the answer: a replay after a GPU failure is "failed over", a request the GPU profile could
    not take is "CPU" with its reason, a peer's answer names the peer (never this machine's GPU or CPU)."""
    worker = answered_on(info)
    reason = str(info.get("fallback_reason") or "")
    attempts = int(info.get("attempts") or 1)
    rate = tokens_per_second(tokens, seconds)
    speed = f" · {rate:.1f} tok/s" if rate is not None else ""
    short = short_reason(reason)
    detail = f"Reason: {reason_text(reason)}; attempts: {attempts}" if reason else f"Attempts: {attempts}"
    peer = answering_peer(info)
    if peer is not None:
        detail = f"Answered on {peer_place(peer)}. {detail}"
        if attempts > 1:
            return Badge(PEER_BADGE_KIND, f"Failed over to {peer}: {short}{speed}", detail)
        because = f": {short}" if reason else ""
        return Badge(PEER_BADGE_KIND, f"On {peer}{because}{speed}", detail)
    if worker == "cpu" and attempts > 1:
        return Badge("failover", f"Failed over to CPU: {short}{speed}", detail)
    if worker == "cpu" and reason == Reason.APPROVAL_REQUIRED:
        return Badge("cpu", f"CPU, approved by you{speed}", detail)
    if worker == "cpu":
        because = f": {short}" if reason else ""
        return Badge("cpu", f"CPU{because}{speed}", detail)
    if worker == "gpu":
        retried = f" · {attempts} attempts" if attempts > 1 else ""
        return Badge("gpu", f"GPU{' (simulated)' if simulated else ''}{retried}{speed}", detail)
    return Badge("gpu" if worker else "stopped", f"{worker or 'Unknown worker'}{speed}", detail)


def model_badge(info: AnswerInfo) -> Badge | None:
    """ "gemma3-270m on GPU · stand-in for qwen3-8b"; None from a service that does not name the model."""
    model = str(info.get("model") or "")
    if not model:
        return None
    device = answered_on(info)
    short = short_model_name(model)
    text = f"{short} on {device_name(device)}" if device else short
    detail = f"Answered by {model} {where_text(device)}" if device else f"Answered by {model}"
    peer = answering_peer(info)
    if peer is not None:
        text, detail = f"{short} on {peer}", f"Answered by {model} on {peer_place(peer)}"
    stand_in_for = str(info.get("stand_in_for") or "")
    if stand_in_for:
        return Badge(
            "stand_in",
            f"{text} · stand-in for {short_model_name(stand_in_for)}",
            f"{detail}, standing in for {stand_in_for}, which could not answer on the GPU",
        )
    if peer is not None:
        return Badge(PEER_BADGE_KIND, text, detail)
    return Badge(device if device in ("gpu", "cpu") else "stopped", text, detail)


def short_model_name(name: str, limit: int = MODEL_NAME_CHARS) -> str:
    """`name` cut in the middle to `limit` characters: a GGUF file name keeps its start (the model) and its
    end (the quantisation)."""
    if len(name) <= limit:
        return name
    tail = limit // 3
    return f"{name[: limit - tail - 1]}…{name[-tail:]}"


def with_header_model(info: AnswerInfo, headers: Mapping[str, str]) -> AnswerInfo:
    """The answer's `failsoft` object, with the model from the X-Failsoft-* headers when it names none (a job
    result read back after its stream ended). The header's device only counts when nothing else says where
    it ran: a failover after the headers moves the answer to the CPU, or to a peer."""
    info = info.copy()
    if not info.get("model") and headers.get("x-failsoft-model"):
        info["model"] = headers["x-failsoft-model"]
        if not answered_on(info) and answering_peer(info) is None and headers.get("x-failsoft-device"):
            info["device"] = headers["x-failsoft-device"]
    return info


def job_info(job: JobSummary) -> AnswerInfo:
    """Who answered, from a job read back whose result has no `failsoft` object of its own."""
    return {
        "worker": job.get("worker"),
        "route": job.get("route"),
        "attempts": job.get("attempts"),
        "fallback_reason": job.get("fallback_reason"),
    }


def completion_text(result: Mapping[str, Any]) -> tuple[str, str]:
    """A finished job's answer and its reasoning (a thinking model's; else ""), from its OpenAI body."""
    choices = result.get("choices") or []
    if not choices:
        return "", ""
    choice = choices[0]
    message = choice.get("message") or {}
    text = str(message.get("content") or choice.get("text") or "")
    return text, str(message.get("reasoning_content") or "")
