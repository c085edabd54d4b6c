"""Failsoft: plan VRAM before it is spent, and fail over safely from a GPU worker to a warm CPU worker."""

__version__ = "0.1.0"
