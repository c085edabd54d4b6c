"""One owner per worker: spawn, health, failure classification, restart with backoff."""

from tray_app.supervisor.classify import FAILURE_KINDS, Failure, FailureKind, classify_exit
from tray_app.supervisor.profile import profiles_from_plans
from tray_app.supervisor.supervisor import STATES, State, SupervisorError, WorkerSupervisor

__all__ = [
    "FAILURE_KINDS",
    "STATES",
    "Failure",
    "FailureKind",
    "State",
    "SupervisorError",
    "WorkerSupervisor",
    "classify_exit",
    "profiles_from_plans",
]
