"""One leader-elected pump: a PostgreSQL session advisory lock, standbys, reconnects.

The relay and the dispatcher each need exactly one active process per database (the relay
for the ``id`` order of the outbox, the dispatcher for the warehouse account's rate cap), and
each gets it the same way, written here once. A :class:`Pump` opens a session of its own to
PostgreSQL and tries its lock (``adapters.postgres.advisory_lock``) on it. The holder does its
work (:meth:`Pump.work`: the relay reads and publishes the outbox, the dispatcher claims,
sends and records warehouse requests); the other replicas stand by, trying the lock every
``poll_seconds`` and doing their standby duty (:meth:`Pump.stand_by`: the backlog's gauges,
so that the alerts on them hold when no replica is active). The lock is held until the
session ends, so a holder that exits, crashes or loses its connection frees it for a standby
without a time-out of ours.

While active, the pump pings its session every ``poll_seconds`` (unless the work itself runs
on that session: :attr:`Pump.pings`), so that a network gone quiet is seen. A session lost
ends the work (which finishes what is in flight) and the pump connects again, with tenacity's
exponential wait and jitter between tries (:data:`RECONNECT_INITIAL_SECONDS` doubling to
:data:`RECONNECT_MAX_SECONDS`), until it is stopped. After a session that was connected,
the back-off starts again from the first wait, so that a later outage is not met at the cap.

Log events (:class:`PumpEvents`), ``<name>`` being ``relay`` or ``dispatcher``:
``<name>.standing_by`` once connected, ``<name>.active`` on taking the lock,
``<name>.connection_lost`` when a connected session is lost, ``<name>.reconnecting`` before
each wait between tries, ``<name>.stopped``.
The shape follows FastStream's consume loop, written once for every subscriber
(``faststream/rabbit/subscriber/usecase.py``) and specialised by what each one supplies.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import asyncpg
import structlog
from prometheus_client import Gauge
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from fulfilment.adapters.postgres.advisory_lock import try_advisory_lock
from fulfilment.adapters.postgres.errors import SESSION_LOST_ERRORS

RECONNECT_INITIAL_SECONDS = 0.5
"""First wait before connecting again (plus up to 1 s of jitter), after a failed attempt or
the loss of a connected session."""

RECONNECT_MAX_SECONDS = 10.0
"""Longest wait between two attempts to connect; a pump tries until it is stopped."""


async def sleep_unless(event: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds`` (nothing when not positive), or less when ``event`` is or gets set."""
    if seconds <= 0:
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


class Role(enum.StrEnum):
    """What a pump is doing: connecting, standing by for the lock, or holding it and working."""

    CONNECTING = "connecting"
    STANDBY = "standby"
    ACTIVE = "active"


class SessionLostError(Exception):
    """A connected session lost a service it needs; the message says how.

    Not one of :attr:`Pump.reconnect_errors`: it ends a run of attempts, so that the next
    outage's back-off starts again from :data:`RECONNECT_INITIAL_SECONDS`.
    """

    def __init__(self, lost: BaseException) -> None:
        super().__init__(f"{type(lost).__name__}: {lost}")


@dataclass(frozen=True, slots=True)
class PumpEvents:
    """A pump's log events.

    Each is written whole where the pump is declared, so that a search for one (the
    runbook's check makes it) finds it in the source.
    """

    starting: str
    """Before the start-up checks (``<name>.starting``; ``startup.run_pump``)."""
    standing_by: str
    """Connected; trying the lock (``<name>.standing_by``)."""
    active: str
    """The lock taken (``<name>.active``)."""
    connection_lost: str
    """A connected session lost a service (``<name>.connection_lost``)."""
    reconnecting: str
    """Before each wait between two attempts to connect (``<name>.reconnecting``)."""
    stopped: str
    """:meth:`Pump.run` returns after a stop (``<name>.stopped``)."""


@dataclass(frozen=True, slots=True)
class LockOptions:
    """The pump's session and lock, built by its root from the settings.

    Attributes:
        database_url: PostgreSQL URL for asyncpg (``postgresql://``).
        key: the advisory lock's key (``advisory_lock.RELAY_LOCK_KEY``, ``DISPATCHER_LOCK_KEY``).
        connect_timeout_seconds: time allowed to open the session, and for each ping.
        poll_seconds: how often a standby tries the lock, and the holder pings its session.
    """

    database_url: str = field(repr=False)
    key: int
    connect_timeout_seconds: float
    poll_seconds: float


class Pump(abc.ABC):
    """One process's turn on the lock; :meth:`run` until :meth:`stop`.

    A subclass names itself (:attr:`name`), says which errors mean a lost service
    (:attr:`reconnect_errors`), and supplies :meth:`stand_by`, :meth:`work` and
    :meth:`readiness`; :meth:`connected` opens what else its session needs.

    Args:
        lock: the session's URL and time bounds, and the lock's key.
        active: the gauge set to 1 while this process holds the lock, else 0.
    """

    name: ClassVar[str]
    """``relay`` or ``dispatcher``: in the logger's name and the session's
    ``application_name`` (``fulfilment-<name>``)."""

    events: ClassVar[PumpEvents]
    """Its log events."""

    reconnect_errors: ClassVar[tuple[type[Exception], ...]] = SESSION_LOST_ERRORS
    """What ends a session and makes the pump connect again: at least the database's session
    lost (``adapters.postgres.errors.SESSION_LOST_ERRORS``)."""

    pings: ClassVar[bool] = True
    """Whether the session is pinged while active; False where :meth:`work` itself queries
    the session at least every ``poll_seconds`` (a ping beside it would collide with its
    statements on the one connection)."""

    def __init__(self, lock: LockOptions, active: Gauge) -> None:
        self._lock = lock
        self._active = active
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._logger = structlog.get_logger(f"fulfilment.{self.name}")
        self.role = Role.CONNECTING

    @property
    def stopping(self) -> asyncio.Event:
        """Set by :meth:`stop`; what the work and the start-up checks watch."""
        return self._stopping

    def stop(self) -> None:
        """Ask :meth:`run` to return once the work in flight is done (SIGTERM, SIGINT)."""
        self._stopping.set()
        self._wake.set()

    @abc.abstractmethod
    def readiness(self) -> dict[str, bool | str]:
        """What ``/health/ready`` reports, with at least ``"role"``."""

    @abc.abstractmethod
    def ready(self) -> bool:
        """True when ``/health/ready`` answers 200."""

    async def probe(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, readiness)`` for ``observability.probes.probe_app``."""
        return self.ready(), dict(self.readiness())

    async def run(self) -> None:
        """Connect, stand by, work; connect again after any loss, until stopped.

        Raises only what no reconnection can mend (a programming error).
        """
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(self.reconnect_errors),
            wait=wait_exponential_jitter(
                multiplier=RECONNECT_INITIAL_SECONDS, max=RECONNECT_MAX_SECONDS
            ),
            stop=lambda _state: self._stopping.is_set(),
            sleep=self.pause,
            before_sleep=self._log_reconnect,
            reraise=True,
        )
        while not self._stopping.is_set():
            try:
                # Each call begins with fresh statistics: attempt 1, the first wait.
                await retrying(self._session)
            except SessionLostError as lost:
                self._logger.warning(
                    self.events.connection_lost,
                    error=str(lost),
                    wait_seconds=RECONNECT_INITIAL_SECONDS,
                )
                await self.pause(RECONNECT_INITIAL_SECONDS)
            except self.reconnect_errors:
                if not self._stopping.is_set():
                    raise
        self._logger.info(self.events.stopped)

    async def _session(self) -> None:
        """One session, from connecting to its loss or a stop.

        Raises:
            reconnect_errors: a service did not answer, or closed a connection being set up.
            SessionLostError: a connected session lost a service.
        """
        if self._stopping.is_set():
            return
        lock = self._lock
        session = await asyncpg.connect(
            lock.database_url,
            timeout=lock.connect_timeout_seconds,
            server_settings={"application_name": f"fulfilment-{self.name}"},
        )
        lost = asyncio.Event()

        def terminated(_connection: object) -> None:
            lost.set()
            self._wake.set()

        session.add_termination_listener(terminated)
        try:
            async with self.connected(session):
                self.role = Role.STANDBY
                self._logger.info(self.events.standing_by)
                try:
                    if await self._take_lock(session):
                        await self._active_turn(session, lost)
                except self.reconnect_errors as error:
                    raise SessionLostError(error) from error
        finally:
            self.role = Role.CONNECTING
            self._active.set(0)
            # Closing the session releases the lock at once for a standby.
            with contextlib.suppress(*self.reconnect_errors, asyncpg.PostgresError):
                await session.close(timeout=lock.connect_timeout_seconds)

    async def _take_lock(self, session: asyncpg.Connection) -> bool:
        """Stand by until the lock is held (True), or until stopped (False)."""
        while not self._stopping.is_set():
            if await try_advisory_lock(session, self._lock.key):
                return True
            await self.stand_by(session)
            await self.wait(self._lock.poll_seconds)
        return False

    async def _active_turn(self, session: asyncpg.Connection, lost: asyncio.Event) -> None:
        """Work while the lock is held; raise when the session was lost rather than stopped."""
        self.role = Role.ACTIVE
        self._active.set(1)
        self._logger.info(self.events.active)
        pinging = asyncio.create_task(self._ping(session, lost)) if self.pings else None
        try:
            await self.work(session, lost)
        finally:
            if pinging is not None:
                pinging.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pinging
        if lost.is_set() and not self._stopping.is_set():
            raise SessionLostError(ConnectionError(f"the {self.name}'s lock session was lost"))

    async def _ping(self, session: asyncpg.Connection, lost: asyncio.Event) -> None:
        """Set ``lost`` when the session stops answering (a network gone quiet)."""
        while not self._stopping.is_set() and not lost.is_set():
            await asyncio.sleep(self._lock.poll_seconds)
            try:
                await session.fetchval("SELECT 1", timeout=self._lock.connect_timeout_seconds)
            except (*self.reconnect_errors, asyncpg.PostgresError):
                lost.set()
                self._wake.set()

    @contextlib.asynccontextmanager
    async def connected(self, session: asyncpg.Connection) -> AsyncIterator[None]:
        """Open, around the standby and the work, what the pump needs beside ``session``.

        Nothing by default. Errors of :attr:`reconnect_errors` raised while opening are
        retried as a failed attempt to connect.
        """
        del session
        yield

    @abc.abstractmethod
    async def stand_by(self, session: asyncpg.Connection) -> None:
        """The standby's duty before each wait for the lock (the backlog's gauges).

        Raises:
            reconnect_errors: the session was lost (the pump connects again).
        """

    @abc.abstractmethod
    async def work(self, session: asyncpg.Connection, lost: asyncio.Event) -> None:
        """The active turn: return once ``lost`` or :attr:`stopping` is set, its work done.

        Raises:
            reconnect_errors: a service was lost (the pump connects again).
        """

    def wake(self) -> None:
        """End the current :meth:`wait` early (a notification, a closed connection)."""
        self._wake.set()

    async def wait(self, seconds: float) -> None:
        """Wait ``seconds``, or less when woken (:meth:`wake`), stopped or the session lost."""
        await sleep_unless(self._wake, seconds)
        self._wake.clear()

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds`` (nothing when not positive), or less when stopped: a back-off."""
        await sleep_unless(self._stopping, seconds)

    def _log_reconnect(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        self._logger.warning(
            self.events.reconnecting,
            attempt=state.attempt_number,
            error=f"{type(error).__name__}: {error}",
            wait_seconds=round(state.upcoming_sleep, 2),
        )
