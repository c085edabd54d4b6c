"""Reaching the user away from the server: notification channels (ntfy, webhooks, Apprise), the signed
Approve/Reject links they carry, and the dispatcher that turns the service's events into messages."""
