"""The service: OpenAI-compatible router, admission, failover policy, journal, jobs and the control API."""
