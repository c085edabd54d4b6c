"""The running service from a terminal: `failsoft status`, `approvals`, `approve`, `reject`, `load`, `unload`
and `worker`, for a home server with no tray (or a tray elsewhere). A client of the HTTP API only."""
