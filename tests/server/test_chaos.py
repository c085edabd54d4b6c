"""Chaos through real processes: the drill's mix (tray_app/drill/chaos.py) of OpenAI, Ollama and Anthropic
streams, forced tool calls, background jobs and embeddings, with slow readers, clients that stop reading
for good (under a keep-alive shorter than the stall limit: review F1), clients that leave mid-stream and
requests carrying engine fields, while the GPU worker is SIGKILLed and hung at intervals.

Afterwards every invariant of tray_app/drill/invariants.py holds: no job left running or queued, every
worker's slots free, the queue empty, every completed answer whole, nothing lost, 0 answered twice, one
job per Idempotency-Key, 0 repeated tool calls, every engine field refused. `failsoft drill --soak` runs
the same mix for as long as asked."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.helpers import base_settings
from tests.support.service import ServiceHandle, module_service
from tray_app.drill.chaos import KINDS, MixPlan, MixResult, run_mix
from tray_app.drill.chaos_observe import observe
from tray_app.drill.chaos_summary import Figures
from tray_app.drill.client import ServiceClient
from tray_app.drill.invariants import Observed, check

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SETTINGS = base_settings(
    # A keep-alive comment every 2 s: far inside the 15 s stall limit, which must still drop non-readers.
    server={"queue_max": 64, "keepalive_seconds": 2.0},
    failover={"auto_approve_seconds": 3600},
    cpu={"threads": 1},
)
PLAN = MixPlan(requests=120, clients=6, seconds=150.0, request_timeout=150.0, fault_every=(2.5, 4.5), seed=5)
# Non-streamed requests fail over whole: each is answered, whatever happened to the GPU worker.
ALWAYS_ANSWERED = ("openai_tool", "job", "embedding")


svc = module_service(enable_faults=True, settings=SETTINGS)


async def play(svc: ServiceHandle) -> tuple[MixResult, Observed]:
    client = ServiceClient(svc.base_url, svc.api_key, admin=svc.admin_token)
    try:
        result = await run_mix(client, PLAN)
        return result, await observe(client, result.sents)
    finally:
        await client.aclose()


def test_chaos_leaves_every_invariant_holding(svc: ServiceHandle) -> None:
    result, observed = asyncio.run(play(svc))
    report = check(result.sents, observed)
    figures = Figures()
    figures.add(result, observed)
    print("\n" + "\n".join([*figures.lines(), *report.lines()]))
    assert report.held, "\n".join(report.lines())
    # The chaos happened: every kind ran, the GPU worker was killed and hung, and requests failed over.
    assert set(result.started) == set(KINDS), result.started
    assert result.faults.kills >= 2 and result.faults.hangs >= 2, result.faults
    assert figures.failovers > 0
    unanswered = [
        f"{sent.kind} {sent.outcome} {sent.code} {sent.detail}"
        for sent in result.sents
        if sent.kind in ALWAYS_ANSWERED and sent.outcome != "completed"
    ]
    assert not unanswered, unanswered
