"""What each scenario plays and what it must see, written down as the docs' tables state it (docs/drill.md).

Literals on purpose: the drill checks the service's failover policy, so it never asks that policy what to
expect. A scenario whose situation this service cannot set up is skipped with the reason instead.
"""

from __future__ import annotations

from tray_app.drill.peer_pair import PEER_NAME
from tray_app.drill.records import Expectation

TITLES = {
    "a": "request beyond the GPU profile, within RAM (non-streamed)",
    "b": "request beyond the GPU profile, within RAM (streamed)",
    "c": "client cancels during the CPU fallback (streamed)",
    "d": "concurrent traffic while the GPU worker crashes",
    "e": "agent turn with a simulated tool under a GPU fault",
    "f": "GPU worker crash mid-generation (abort)",
    "g": "GPU worker hangs mid-generation (SIGSTOP, streamed)",
    "h": "GPU pressure: a big model's request answered by its stand-in",
    "i": "GPU pressure, stand-in refused: the big model on its CPU",
    "j": "eviction: an idle model makes room, a busy one never",
    "k": "another program takes the GPU: seen, named, acted on; the GPU back after it exits",
    "l": "a conversation over 1,500 tokens loses its GPU worker mid-stream: the CPU has read it already",
    "m": "this GPU taken: the peer's GPU answers",
    "n": "the peer killed mid-stream: this CPU finishes, once",
    "o": "the RPC box killed mid-stream: this CPU finishes, once; the GPU planned without it",
}

# How a GPU worker killed by SIGABRT is named: by the failure signature, or by how the process ended once its
# supervisor knows (a dropped connection first).
ABORT_KINDS = ("crash_abort", "exited", "killed")
REPLAYED = ("gpu failed", "cpu completed")  # one failed GPU attempt, one CPU attempt that answered

# One job each: route, reason, final state and the job's attempts ("worker outcome", in order).
EXPECTED: dict[str, Expectation] = {
    # Beyond the GPU profile, within the CPU's: the CPU at admission, no GPU attempt.
    "a": Expectation("cpu", ("exceeds_gpu_profile",), "completed", ("cpu completed",)),
    "b": Expectation("cpu", ("exceeds_gpu_profile",), "completed", ("cpu completed",)),
    # The GPU aborts before any text; the client closes during the CPU replay, which is cancelled, not rerun.
    "c": Expectation("cpu", ABORT_KINDS, "cancelled", ("gpu failed", "cpu cancelled")),
    # The GPU aborts while it writes the tool call: nothing was delivered, so the CPU makes the call.
    "e": Expectation("cpu", ABORT_KINDS, "completed", REPLAYED),
    # Mid-generation faults: replayed (non-streamed) or resumed (streamed) on the CPU.
    "f": Expectation("cpu", ABORT_KINDS, "completed", REPLAYED),
    "g": Expectation("cpu", ("hung",), "completed", REPLAYED),
    # The ladder: the asked model cannot use the GPU; its stand-in answers there, or with the stand-in
    # refused, the asked model on its own CPU worker.
    "h": Expectation("gpu", ("stand_in",), "completed"),
    "i": Expectation("cpu", ("gpu_unavailable",), "completed"),
    # The GPU worker is killed (SIGKILL) in the last turn's stream: resumed once on the CPU.
    "l": Expectation("cpu", ABORT_KINDS, "completed", REPLAYED),
    # The peers (m, n): this machine's GPU worker stopped, so at admission the job goes to the ready peer.
    "m": Expectation("peer", ("gpu_unavailable",), "completed", (f"peer:{PEER_NAME} completed",)),
    # The peer's service killed mid-stream: its connection drops ("exited": no supervisor here can say how
    # another machine's process ended), and this machine's CPU resumes the stream.
    "n": Expectation("cpu", ("exited",), "completed", (f"peer:{PEER_NAME} failed", "cpu completed")),
    # The RPC box killed mid-stream: llama-server aborts on the lost connection (its own GGML_ABORT, named by
    # its signature), and this machine's CPU resumes the stream.
    "o": Expectation("cpu", ("crash_abort",), "completed", REPLAYED),
}

# d: every job completes once, and the one on the GPU at the crash is replayed on the CPU (the others may
# find the GPU restarting and go either way).
CONCURRENT = "all {count} completed once; the job on the GPU at the crash replayed on the cpu"

# j: the other model loads in place of the idle big one and answers on its own GPU worker; then, with the
# other one busy, the big model cannot load: its stand-in on the GPU answers (h's outcome), or its own CPU
# worker when no stand-in can (i's outcome).
EVICTED_FOR = Expectation("gpu", (), "completed")
WHILE_BUSY_STAND_IN = EXPECTED["h"]
WHILE_BUSY_OWN_CPU = EXPECTED["i"]
