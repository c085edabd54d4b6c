"""The Qt tray, budget bar, approvals, chat and settings windows: a client of the service's HTTP API."""
