"""The lock session's ping: what counts as a lost session (the classification alone)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from fulfilment.dispatcher.leadership import Leadership


class _Connection:
    """Answers every ping with ``error``: a stand-in for the lock's asyncpg session."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.pings: list[tuple[str, float]] = []

    async def fetchval(self, query: str, *, timeout: float) -> int:
        self.pings.append((query, timeout))
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        # What a server killed while it answers leaves in asyncpg's protocol (a failover).
        asyncpg.InternalClientError(
            "cannot switch to state 12; another operation (2) is in progress"
        ),
        asyncpg.exceptions.ConnectionDoesNotExistError(
            "connection was closed in the middle of operation"
        ),
        asyncpg.exceptions.AdminShutdownError(
            "terminating connection due to administrator command"
        ),
        TimeoutError(),
        ConnectionResetError(),
    ],
    ids=lambda error: type(error).__name__,
)
async def test_a_ping_that_fails_marks_the_session_lost_and_stops_pinging(error):
    leadership = Leadership("postgresql://unused", connect_timeout_seconds=1, poll_seconds=0.01)
    connection = _Connection(error)
    lost, stopping = asyncio.Event(), asyncio.Event()

    await asyncio.wait_for(leadership._ping(connection, lost, stopping), 2)  # type: ignore[arg-type]

    assert lost.is_set()
    assert connection.pings == [("SELECT 1", 1)]  # once, within the connect timeout
