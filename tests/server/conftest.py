"""Set-up shared by the tests against a real service: the openai client for a module's `svc`
(tests.support.service.module_service)."""

from __future__ import annotations

import openai
import pytest

from tests.support.helpers import client_for
from tests.support.service import ServiceHandle


@pytest.fixture(scope="module")
def client(svc: ServiceHandle) -> openai.OpenAI:
    """The openai client for the module's service."""
    return client_for(svc)
