"""The running service from a terminal: `failsoft status`, `failsoft approvals`, `failsoft approve` and
`failsoft reject`, for a home server with no tray (or a tray elsewhere). A client of the HTTP API only."""
