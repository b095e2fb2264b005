"""One active dispatcher per database: a session advisory lock, standbys waiting for it.

The rate cap and the ``Retry-After`` gate are the warehouse account's, not a replica's: two
dispatchers sending at once would each hold the cap and together exceed it. So, as the relay
does, replicas take turns on a PostgreSQL session advisory lock
(``adapters.postgres.dispatcher_lock``): the holder claims and sends, the others stand by and
try the lock every ``poll_seconds``, reading the backlog for their gauges. The claim itself is
still ``FOR UPDATE SKIP LOCKED`` with a lease, so that a holder that dies mid-send leaves its
rows to the next one. The lock's session is pinged every ``poll_seconds``; its loss stops the
active loop (its requests in flight are recorded first) and the dispatcher connects again.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg
import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from fulfilment.adapters.postgres.dispatcher_lock import try_dispatcher_lock
from fulfilment.adapters.postgres.errors import SESSION_LOST_ERRORS
from fulfilment.application.ports import TransientError

logger = structlog.get_logger("fulfilment.dispatcher")

RECONNECT_ERRORS = SESSION_LOST_ERRORS
"""What ends the lock's session and makes the dispatcher connect again, the relay's database
errors (``adapters.postgres.errors.SESSION_LOST_ERRORS``). Before they were one list, an
``InternalClientError`` after a failover ended the ping unseen, and the dispatcher went on
sending without a live lock."""

RECONNECT_INITIAL_SECONDS = 0.5
"""First wait before connecting again (plus up to 1 s of jitter)."""

RECONNECT_MAX_SECONDS = 10.0
"""Longest wait between two attempts to connect."""


class Role(enum.StrEnum):
    """What a dispatcher is doing: connecting, standing by for the lock, or sending."""

    CONNECTING = "connecting"
    STANDBY = "standby"
    ACTIVE = "active"


@dataclass
class Leadership:
    """Takes turns on the lock; :meth:`run` until ``stopping`` is set.

    Attributes:
        database_url: PostgreSQL URL for asyncpg (``postgresql://``).
        connect_timeout_seconds: time allowed to open the lock's session and for each ping.
        poll_seconds: how often a standby tries the lock, and the holder pings its session.
    """

    database_url: str = field(repr=False)
    connect_timeout_seconds: float
    poll_seconds: float
    role: Role = Role.CONNECTING

    async def run(
        self,
        active: Callable[[asyncio.Event], Awaitable[None]],
        standby: Callable[[], Awaitable[None]],
        stopping: asyncio.Event,
    ) -> None:
        """Stand by, then ``await active(lost)`` while holding the lock; again after a loss.

        ``active`` must return once ``lost`` or ``stopping`` is set; ``standby`` is awaited
        every ``poll_seconds`` while another replica holds the lock (its ``TransientError`` is
        logged and ignored).
        """

        async def pause(seconds: float) -> None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await stopping.wait()

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(RECONNECT_ERRORS),
            wait=wait_exponential_jitter(
                multiplier=RECONNECT_INITIAL_SECONDS, max=RECONNECT_MAX_SECONDS
            ),
            stop=lambda _state: stopping.is_set(),
            sleep=pause,
            before_sleep=_log_reconnect,
            reraise=True,
        )
        while not stopping.is_set():
            try:
                await retrying(self._session, active, standby, stopping, pause)
            except RECONNECT_ERRORS:
                if not stopping.is_set():
                    raise

    async def _session(
        self,
        active: Callable[[asyncio.Event], Awaitable[None]],
        standby: Callable[[], Awaitable[None]],
        stopping: asyncio.Event,
        pause: Callable[[float], Awaitable[None]],
    ) -> None:
        connection = await asyncpg.connect(
            self.database_url,
            timeout=self.connect_timeout_seconds,
            server_settings={"application_name": "fulfilment-dispatcher"},
        )
        lost = asyncio.Event()
        connection.add_termination_listener(lambda _connection: lost.set())
        try:
            self.role = Role.STANDBY
            logger.info("dispatcher.standing_by")
            while not stopping.is_set():
                if await try_dispatcher_lock(connection):
                    break
                try:
                    await standby()
                except TransientError as error:
                    logger.warning("dispatcher.store_failed", error=str(error))
                await pause(self.poll_seconds)
            else:
                return
            self.role = Role.ACTIVE
            logger.info("dispatcher.active")
            pinging = asyncio.create_task(self._ping(connection, lost, stopping))
            try:
                await active(lost)
            finally:
                pinging.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pinging
            if lost.is_set() and not stopping.is_set():
                msg = "the dispatcher's lock session was lost"
                raise ConnectionError(msg)
        finally:
            self.role = Role.CONNECTING
            with contextlib.suppress(*RECONNECT_ERRORS, asyncpg.PostgresError):
                await connection.close(timeout=self.connect_timeout_seconds)

    async def _ping(
        self, connection: asyncpg.Connection, lost: asyncio.Event, stopping: asyncio.Event
    ) -> None:
        """Set ``lost`` when the lock's session stops answering (a network gone quiet)."""
        while not stopping.is_set() and not lost.is_set():
            await asyncio.sleep(self.poll_seconds)
            try:
                await connection.fetchval("SELECT 1", timeout=self.connect_timeout_seconds)
            except (*RECONNECT_ERRORS, asyncpg.PostgresError):
                lost.set()


def _log_reconnect(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    logger.warning(
        "dispatcher.reconnecting",
        attempt=state.attempt_number,
        error=f"{type(error).__name__}: {error}",
        wait_seconds=round(state.upcoming_sleep, 2),
    )
