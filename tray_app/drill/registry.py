"""Which coroutine plays each scenario, a to o, in the order the drill runs them (titles: `expected`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tray_app.drill import conversation_failover, eviction, ladder, peers, rpc_box, scenarios, takeover
from tray_app.drill.context import DrillContext
from tray_app.drill.records import ScenarioRecord

Scenario = Callable[[DrillContext], Awaitable[ScenarioRecord]]
SCENARIOS: dict[str, Scenario] = {
    "a": lambda ctx: scenarios.capacity_fallback(ctx, streamed=False),
    "b": lambda ctx: scenarios.capacity_fallback(ctx, streamed=True),
    "c": scenarios.cancel_during_fallback,
    "d": scenarios.concurrent_failover,
    "e": scenarios.agent_turn,
    "f": lambda ctx: scenarios.mid_generation_fault(ctx, "abort", streamed=False),
    "g": lambda ctx: scenarios.mid_generation_fault(ctx, "hang", streamed=True),
    "h": ladder.stand_in_under_pressure,
    "i": ladder.cpu_under_pressure,
    "j": eviction.eviction,
    "k": takeover.takeover,
    "l": conversation_failover.conversation_failover,
    "m": peers.gpu_taken,
    "n": peers.peer_killed,
    "o": rpc_box.box_killed,
}

# Played on a service of their own with longer GPU slots when the drill starts the service itself.
LONG_SLOT_SCENARIOS = ("l",)
# Played on a pair of services, one the other's peer (drill.peer_pair), when the drill starts them itself.
PEER_SCENARIOS = ("m", "n")
# Played on an RPC box and a service whose GPU worker spans it (drill.rpc_box), when the drill starts them.
RPC_SCENARIOS = ("o",)
