"""Where the test services are, and what a test does when one does not answer.

Shared by every suite's fixtures (a module of its own, since ``conftest`` modules of several
folders cannot be told apart by import).
"""

from __future__ import annotations

import os

import pytest

ADMIN_DATABASE_URL = os.environ.get(
    "FULFILMENT_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
AMQP_URL = os.environ.get("FULFILMENT_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def service_unavailable(what: str, error: BaseException) -> None:
    """Fail under CI (a missing service must never pass silently); skip elsewhere."""
    message = f"{what} is not reachable: {type(error).__name__}: {error}"
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)
