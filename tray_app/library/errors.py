"""Why a library model could not be loaded: raised by the host's library, read by the intake and the API."""

from __future__ import annotations


class LoadRefused(Exception):
    """A model cannot be loaded on the GPU now; the message says why (a reason code in `code`)."""

    def __init__(self, message: str, code: str = "model_does_not_fit") -> None:
        super().__init__(message)
        self.code = code
