"""The llama-server workers a service runs, by role: a chat worker per device, and beside each an
embeddings worker (`llama-server --embeddings`), which llama.cpp advises for embedding models only."""

from __future__ import annotations

from typing import Literal

Role = Literal["gpu", "cpu", "gpu-embed", "cpu-embed"]
ChatRole = Literal["gpu", "cpu"]  # a chat worker's role: the device a job is routed to
CHAT_ROLES: tuple[ChatRole, ...] = ("gpu", "cpu")
# Where a job runs: this machine's GPU or CPU, or a peer (another machine's server, `[[peers]]`), whose
# worker role is "peer:<name>".
Route = Literal["gpu", "peer", "cpu"]
PEER_ROLE_PREFIX = "peer:"
EMBED_ROLES: dict[str, Role] = {"gpu": "gpu-embed", "cpu": "cpu-embed"}  # by the chat worker's role
