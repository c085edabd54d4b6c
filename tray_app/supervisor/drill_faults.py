"""A drill's one-shot fault in a worker (tray_app.engine.faults): armed on request, due once the router has
relayed enough of the worker's tokens, then fired as the signal a real failure ends the process with."""

from __future__ import annotations

from tray_app.contract.vocabulary import WorkerState
from tray_app.engine.faults import SIGNALS, ArmedFault, check_fault
from tray_app.supervisor.messages import SupervisorError
from tray_app.supervisor.process import WorkerProcess


def arm(role: str, enabled: bool, state: WorkerState, up: bool, kind: str, after_tokens: int) -> ArmedFault:
    """The fault to arm, or SupervisorError saying why none can be (`up`: a process is running)."""
    if not enabled:
        raise SupervisorError(f"fault injection is off for the {role} worker")
    if not up or state != "ready":
        raise SupervisorError(f"the {role} worker is {state}: no fault can be armed")
    try:
        return check_fault(kind, after_tokens)
    except ValueError as error:
        raise SupervisorError(f"the {role} worker refused the fault: {error}") from None


def due(fault: ArmedFault, tokens: int) -> bool:
    """Count `tokens` more relayed tokens (0: a request is about to be sent); True once it should fire."""
    fault.seen_tokens += tokens
    return fault.seen_tokens >= fault.after_tokens


def fire(fault: ArmedFault, process: WorkerProcess) -> None:
    process.log_line(f"--- fault injected: {fault.kind} after {fault.seen_tokens} tokens (drill)")
    process.signal_group(SIGNALS[fault.kind])
