"""Helpers shared by test areas (starting a real service, waiting for readiness)."""
